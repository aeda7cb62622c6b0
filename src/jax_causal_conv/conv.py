"""causal_conv1d and causal_conv1d_varlen: the kernels behind a custom_vjp.

The forward saves only its inputs; the backward kernel recomputes the
pre-activation on the fly (a few FMAs per element) instead of storing it."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from . import prefix, reference
from . import validation as V
from ._lowering import batching
from ._lowering.config import ROWS, SEQ_IDX, VARLEN, ConvConfig


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _conv(cfg, x, w, b, res, seq_idx, cu, init):
    return batching.forward(cfg, x, w, b, res, seq_idx, cu, init)


def _conv_fwd(cfg, x, w, b, res, seq_idx, cu, init):
    out = batching.forward(dataclasses.replace(cfg, differentiated=True), x, w, b, res, seq_idx, cu, init)
    return out, (x, w, b, res is not None, seq_idx, cu, init)


def _conv_bwd(cfg, saved, cts):
    x, w, b, has_res, seq_idx, cu, init = saved
    dy, dfin = cts
    dx, dw, db, dinit = batching.backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin)
    return dx, dw, db, (dy if has_res else None), None, None, dinit


_conv.defvjp(_conv_fwd, _conv_bwd)
# jit caches the traced call per config and shapes: eager calls dispatch in
# microseconds instead of re-tracing; under an outer jit it is inlined.
_conv = jax.jit(_conv, static_argnums=0)


def _as(a, dtype):
    return None if a is None else jnp.asarray(a).astype(dtype)


def causal_conv1d(x, weight, bias=None, *, activation=None, residual=None, seq_idx=None,
                  initial_states=None, return_final_states=False, channels_last=False,
                  backend="auto"):
    """Causal depthwise conv1d.

    ``y[b, d, t] = act(bias[d] + sum_k weight[d, k] * xp[b, d, t + k]) + residual``
    with ``xp = concat(initial_states, x)`` along time. ``x`` is (B, D, L), or
    (B, L, D) with ``channels_last=True``; ``weight`` is (D, W), ``bias`` (D,).
    Returns ``y``, or ``(y, final_states)`` with ``return_final_states=True``
    (the last W-1 inputs of ``xp``, shaped like ``initial_states``).
    ``seq_idx`` (B, L) int32 separates packed sequences. ``backend``: "auto"
    (our kernel where one exists and is faster, else pure XLA: on a GPU see
    _lowering/routing.py), "ffi" or "xla".
    """
    V.check_backend(backend)
    act = V.check_conv(x, weight, bias, residual, seq_idx, initial_states, channels_last,
                       activation)
    if backend == "xla" or 0 in x.shape:
        return reference.causal_conv1d(
            x, weight, bias, activation=act, residual=residual, seq_idx=seq_idx,
            initial_states=initial_states, return_final_states=return_final_states,
            channels_last=channels_last)
    x = jnp.asarray(x)
    cfg = ConvConfig(activation=act, mode=ROWS if seq_idx is None else SEQ_IDX,
                       channels_last=bool(channels_last), states_channels_last=bool(channels_last),
                       want_final=bool(return_final_states), backend=backend)
    y, fin = _conv(cfg, x, jnp.asarray(weight)[None], None if bias is None else jnp.asarray(bias)[None],
                   _as(residual, x.dtype), _as(seq_idx, jnp.int32), None,
                   _as(initial_states, x.dtype))
    return (y, fin) if return_final_states else y


def causal_conv1d_varlen(x, weight, bias=None, *, cu_seqlens, activation=None,
                         initial_states=None, return_final_states=False, block_size=None,
                         max_blocks=None, backend="auto"):
    """Causal conv1d over sequences packed along tokens.

    ``x`` is (T, D); sequence n is ``x[cu_seqlens[n]:cu_seqlens[n+1]]``.
    ``initial_states`` / ``final_states`` are per sequence, (N, D, W-1).
    With ``block_size`` and ``max_blocks`` (prefix caching) the result gains a
    last element, each sequence's state after every ``block_size`` tokens,
    (N, max_blocks, D, W-1), zeros past its end (see
    :func:`jax_causal_conv.prefix.causal_conv1d_varlen_block_states`).
    """
    if block_size is not None or max_blocks is not None:
        if block_size is None or max_blocks is None:
            raise ValueError("block_size and max_blocks go together, got "
                             f"block_size={block_size!r}, max_blocks={max_blocks!r}")
        out = causal_conv1d_varlen(x, weight, bias, cu_seqlens=cu_seqlens, activation=activation,
                                   initial_states=initial_states,
                                   return_final_states=return_final_states, backend=backend)
        snaps = prefix.causal_conv1d_varlen_block_states(
            x, cu_seqlens, jnp.shape(weight)[-1] - 1, block_size=block_size, max_blocks=max_blocks,
            initial_states=initial_states)
        return (*out, snaps) if return_final_states else (out, snaps)
    V.check_backend(backend)
    act = V.check_varlen(x, weight, bias, cu_seqlens, initial_states, activation)
    if backend == "xla" or 0 in x.shape:
        return reference.causal_conv1d_varlen(
            x, weight, bias, cu_seqlens=cu_seqlens, activation=act,
            initial_states=initial_states, return_final_states=return_final_states)
    x = jnp.asarray(x)
    cfg = ConvConfig(activation=act, mode=VARLEN, channels_last=True,
                       states_channels_last=False, want_final=bool(return_final_states),
                       backend=backend)
    y, fin = _conv(cfg, x[None], jnp.asarray(weight)[None],
                   None if bias is None else jnp.asarray(bias)[None], None, None,
                   _as(cu_seqlens, jnp.int32)[None], _as(initial_states, x.dtype))
    return (y[0], fin) if return_final_states else y[0]
