"""The four kernel entry points as ``custom_vmap`` functions whose rules fold
a mapped axis into the kernel's batch (and a mapped weight into weight
groups), so any nesting of ``vmap`` is still ONE custom call. Each runs our
FFI kernel or its XLA twin through dispatch.py."""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap

from . import ffi_calls, xla_twins
from .config import fold, unfold
from .dispatch import dispatch, union_vma, vma


def _bcast(a, n, batched):
    return a if a is None or batched else jnp.broadcast_to(a, (n,) + a.shape)


def _fold_all(n, args, batched):
    return [fold(_bcast(a, n, bt)) for a, bt in zip(args, batched)]


@functools.lru_cache(maxsize=None)
def _forward_fn(cfg):
    def run(x, w, b, res, seq_idx, cu, init):
        return dispatch(cfg.backend, functools.partial(ffi_calls.forward, cfg),
                        functools.partial(xla_twins.forward, cfg), x.dtype,
                        x, w, b, res, seq_idx, cu, init)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, w, b, res, seq_idx, cu, init):
        xb, wb, bb, rb, sb, cb, ib = in_batched
        if wb or bb or w.shape[0] > 1:  # weights differ per mapped item: fold into groups
            w, b = _fold_all(n, (w, b), (wb, bb))
        x, res, seq_idx, cu, init = _fold_all(n, (x, res, seq_idx, cu, init), (xb, rb, sb, cb, ib))
        y, fin = f(x, w, b, res, seq_idx, cu, init)
        return (unfold(y, n), unfold(fin, n)), (True, None if fin is None else True)

    return f


def forward(cfg, x, w, b, res, seq_idx, cu, init):
    """-> (y, final_states or None)"""
    return _forward_fn(cfg)(x, w, b, res, seq_idx, cu, init)


@functools.lru_cache(maxsize=None)
def _backward_fn(cfg):
    def run(x, w, b, seq_idx, cu, init, dy, dfin):
        return dispatch(cfg.backend, functools.partial(ffi_calls.backward, cfg),
                        functools.partial(xla_twins.backward, cfg), x.dtype,
                        x, w, b, seq_idx, cu, init, dy, dfin)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, w, b, seq_idx, cu, init, dy, dfin):
        # Gradients are per mapped item, so weights and states always get the
        # mapped axis (weights are small; JAX sums unmapped ones afterwards).
        args = _fold_all(n, (x, w, b, seq_idx, cu, init, dy, dfin), in_batched)
        outs = f(*args)
        return tuple(unfold(o, n) for o in outs), tuple(None if o is None else True for o in outs)

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
        return dispatch(cfg.backend, functools.partial(ffi_calls.update, cfg),
                        functools.partial(xla_twins.update, cfg), x.dtype,
                        x, state, w, b, cache, idx)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, state, w, b, cache, idx):
        xb, sb, wb, bb, cb, ib = in_batched
        B, N = x.shape[1] if xb else x.shape[0], state.shape[1] if sb else state.shape[0]
        if idx is None:
            idx, ib = jnp.arange(B, dtype=jnp.int32), False
        # Each mapped item owns its own block of N slots in the folded state.
        idx = _bcast(idx, n, ib)
        offset = (jnp.arange(n, dtype=jnp.int32) * N)[:, None]
        idx = jnp.where((idx >= 0) & (idx < N), idx + offset, -1)
        if wb or bb or w.shape[0] > 1:
            w, b = _fold_all(n, (w, b), (wb, bb))
        x, state, cache = _fold_all(n, (x, state, cache), (xb, sb, cb))
        y, new_state = f(x, state, w, b, cache, fold(idx))
        return (unfold(y, n), unfold(new_state, n)), (True, True)

    return f


def update(cfg, x, state, w, b, cache, idx):
    """x (B, D, S), state (N, D, SL) -> (y, new_state); with cfg.channels_last
    x (B, S, D), state (N, SL, D). The vmap rule folds axis 0, the batch and
    slot axis in both layouts, so neither is ever transposed."""
    return _update_fn(cfg)(x, state, w, b, cache, idx)


@functools.lru_cache(maxsize=None)
def _varlen_states_fn(state_len, backend, channels_last):
    def run(x, cu):
        return dispatch(backend, functools.partial(ffi_calls.varlen_states, state_len,
                                                   channels_last=channels_last),
                        functools.partial(xla_twins.varlen_states, state_len,
                                          channels_last=channels_last), x.dtype, x, cu)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, cu):
        xb, cb = in_batched
        x, cu = _bcast(x, n, xb), _bcast(cu, n, cb)
        T = x.shape[1]
        # Concatenate the mapped items' packed sequences into one longer pack.
        starts = cu[:, :-1] + (jnp.arange(n, dtype=cu.dtype) * T)[:, None]
        cu_all = jnp.concatenate([starts.reshape(-1), jnp.array([n * T], cu.dtype)])
        out = f(fold(x), cu_all)
        return unfold(out, n), True

    return f


def varlen_states(x, cu, state_len, backend, channels_last=False):
    """x (T, D), cu (N+1,) -> (N, D, state_len), or (N, state_len, D) channels-last.
    A vmapped call concatenates the items' packs (the output's axis 0 folds
    either layout)."""
    return _varlen_states_fn(state_len, backend, bool(channels_last))(x, cu)
