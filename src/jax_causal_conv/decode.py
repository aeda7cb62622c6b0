"""Decoding: the rolling/circular state update, and prefill's hand-off."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import validation as V
from . import reference
from ._lowering import batching
from ._lowering.config import UpdateConfig


def causal_conv1d_update(x, conv_state, weight, bias=None, *, activation=None,
                         cache_seqlens=None, conv_state_indices=None, backend="auto"):
    """One decoding step: ``x`` is (B, D) or (B, D, S) new tokens, ``conv_state``
    (N_slots, D, state_len) the most recent inputs, newest last. Returns
    ``(y, new_conv_state)``.

    The kernel aliases the state buffer: under ``jit`` with ``conv_state``
    donated (``donate_argnums``) the state is updated in place, nothing copied.
    ``cache_seqlens`` (B,) makes the state a circular buffer holding that many
    tokens so far; ``conv_state_indices`` (B,) picks each row's slot, -1 for a
    padding row (zeros out, state untouched).
    """
    V.check_backend(backend)
    act = V.check_update(x, conv_state, weight, bias, cache_seqlens, conv_state_indices,
                         activation)
    if backend == "xla" or 0 in x.shape or 0 in conv_state.shape[:2]:
        return reference.causal_conv1d_update(
            x, conv_state, weight, bias, activation=act, cache_seqlens=cache_seqlens,
            conv_state_indices=conv_state_indices)
    x, conv_state = jnp.asarray(x), jnp.asarray(conv_state)
    single = x.ndim == 2
    x3 = x[..., None] if single else x
    cfg = UpdateConfig(activation=act, backend=backend)
    y, new_state = _update(
        cfg, x3, conv_state.astype(x.dtype), jnp.asarray(weight)[None],
        None if bias is None else jnp.asarray(bias)[None],
        None if cache_seqlens is None else jnp.asarray(cache_seqlens, jnp.int32),
        None if conv_state_indices is None else jnp.asarray(conv_state_indices, jnp.int32))
    return (y[..., 0] if single else y), new_state


def causal_conv1d_varlen_states(x, cu_seqlens, state_len, *, backend="auto"):
    """The last ``state_len`` inputs of each packed sequence of ``x`` (T, D),
    zero-padded on the left: (N, D, state_len). Prefill hands these to decode."""
    V.check_backend(backend)
    V.check_varlen_states(x, cu_seqlens, state_len)
    if backend == "xla" or 0 in x.shape or state_len == 0:
        return reference.causal_conv1d_varlen_states(x, cu_seqlens, state_len)
    return _varlen_states(jnp.asarray(x), jnp.asarray(cu_seqlens, jnp.int32), int(state_len),
                          backend)


# Cached per config and shapes, so eager calls do not re-trace (inlined under jit).
_update = jax.jit(batching.update, static_argnums=0)
_varlen_states = jax.jit(batching.varlen_states, static_argnums=(2, 3))
