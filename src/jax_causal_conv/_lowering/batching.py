"""The four kernel entry points as ``custom_vmap`` functions, so that any
nesting of ``vmap`` is still ONE custom call.

A vmapped axis is not folded here: it stays a leading axis of the arrays
(outermost first) and each shard folds its own block into the kernel's batch
(shard_bodies.fold), after partitioning.py has split the arrays over the
mesh. Folding here would reshape a sharded batch axis into a longer one
whose sharding XLA cannot express, and it would gather the activations.
Weights that vary per mapped item get the same leading axes and become the
kernel's weight groups when folded."""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

from . import partitioning
from .dispatch import union_vma, vma


def _bcast(a, n, batched):
    return a if a is None or batched else jnp.broadcast_to(a, (n,) + a.shape)


def _bcast_all(n, args, batched):
    return [_bcast(a, n, bt) for a, bt in zip(args, batched)]


def _true_for(outs):
    return tuple(None if o is None else True for o in outs)


@functools.lru_cache(maxsize=None)
def _forward_fn(cfg):
    def run(x, w, b, res, seq_idx, cu, init):
        return partitioning.forward(cfg, x, w, b, res, seq_idx, cu, init)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, w, b, res, seq_idx, cu, init):
        xb, wb, bb, rb, sb, cb, ib = in_batched
        if wb or bb or w.ndim > 3:  # weights differ per mapped item (from here outwards)
            w, b = _bcast_all(n, (w, b), (wb, bb))
        x, res, seq_idx, cu, init = _bcast_all(n, (x, res, seq_idx, cu, init),
                                               (xb, rb, sb, cb, ib))
        outs = f(x, w, b, res, seq_idx, cu, init)
        return outs, _true_for(outs)

    return f


def forward(cfg, x, w, b, res, seq_idx, cu, init):
    """-> (y, final_states or None)"""
    return _forward_fn(cfg)(x, w, b, res, seq_idx, cu, init)


@functools.lru_cache(maxsize=None)
def _backward_fn(cfg):
    def run(x, w, b, seq_idx, cu, init, dy, dfin):
        return partitioning.backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, w, b, seq_idx, cu, init, dy, dfin):
        # Gradients are per mapped item, so weights and states always get the
        # mapped axis (weights are small; JAX sums unmapped ones afterwards).
        outs = f(*_bcast_all(n, (x, w, b, seq_idx, cu, init, dy, dfin), in_batched))
        return outs, _true_for(outs)

    return f


def backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    """-> (dx, dweight, dbias or None, dinitial_states or None)"""
    grads = _backward_fn(cfg)(x, w, b, seq_idx, cu, init, dy, dfin)
    # Under shard_map: an input replicated over mesh axes the computation varies
    # over (weights under batch/sequence sharding) gets its per-shard partial
    # gradients summed over those axes.
    axes = union_vma((x, w, b, seq_idx, cu, init, dy, dfin))
    return tuple(g if g is None or not (axes - vma(p)) else
                 lax.psum(g, tuple(sorted(axes - vma(p))))
                 for g, p in zip(grads, (x, w, b, init)))


@functools.lru_cache(maxsize=None)
def _update_fn(cfg):
    def run(x, state, w, b, cache, idx):
        return partitioning.update(cfg, x, state, w, b, cache, idx)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, state, w, b, cache, idx):
        xb, sb, wb, bb, cb, ib = in_batched
        if wb or bb or w.ndim > 3:
            w, b = _bcast_all(n, (w, b), (wb, bb))
        # each mapped item owns its own pool of slots (a shared one is copied:
        # the update is functional)
        x, state, cache, idx = _bcast_all(n, (x, state, cache, idx), (xb, sb, cb, ib))
        return f(x, state, w, b, cache, idx), (True, True)

    return f


def update(cfg, x, state, w, b, cache, idx):
    """x (B, D, S), state (N, D, SL) -> (y, new_state); with cfg.channels_last
    x (B, S, D), state (N, SL, D). The vmap rule folds axis 0, the batch and
    slot axis in both layouts, so neither is ever transposed."""
    return _update_fn(cfg)(x, state, w, b, cache, idx)


@functools.lru_cache(maxsize=None)
def _varlen_states_fn(state_len, backend, channels_last):
    def run(x, cu):
        return partitioning.varlen_states(state_len, backend, channels_last, x, cu)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, cu):
        return f(*_bcast_all(n, (x, cu), in_batched)), True

    return f


def varlen_states(x, cu, state_len, backend, channels_last=False):
    """x (T, D), cu (N+1,) -> (N, D, state_len), or (N, state_len, D) channels-last.
    A vmapped call concatenates the items' packs (the output's axis 0 folds
    either layout)."""
    return _varlen_states_fn(state_len, backend, bool(channels_last))(x, cu)
