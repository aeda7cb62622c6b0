"""The Flax modules' decode cache, in plain JAX (shared by linen and nnx).

The cache is channels-last, (B, state_len, D), the layout the update kernel
reads without transposes. Two kinds:

- ordered (``speculative_tokens == 0``): state_len = W-1, the last W-1 inputs,
  newest last: exactly the ``final_states`` of :func:`causal_conv1d`.
- ring (``speculative_tokens = K > 0``): state_len = W-1+K, the input that was
  token number t of row b's stream sits at entry ``t mod state_len``. Two
  counters: ``cache_seqlens[b]``, the tokens before the last step, and
  ``step_tokens[b]``, how many of that step's tokens are kept (all of them
  until ``accept`` keeps fewer); the stream holds their sum. A step first
  commits the kept ones, then writes its S tokens after them. Keeping only
  ``a`` of a step's tokens leaves the next step reading exactly the history
  the ``a`` tokens alone would have left, provided at most K tokens were
  rejected (their writes then never reach the W-1 entries the next step
  reads). Stored this way, a step's counter update depends on the old
  counters only and the update kernel reads its result, so XLA needs no
  copy of a counter the kernel reads while the step overwrites it (with
  the count advanced after the kernel it made one, and each is a kernel
  launch: docs/performance-log.md, 2026-11-26 fifth session).

Short steps (decode, speculative verification) run the update kernel; long
ones (prefill) run the full convolution from the cache's history.
"""

from __future__ import annotations

import jax.numpy as jnp

from .conv import causal_conv1d
from .decode import causal_conv1d_update

# Steps of up to this many tokens go through the update kernel, longer ones
# through the full convolution: the update kernel is built for decode steps
# (one token, or a few for speculative verification), the forward kernel for
# sequences.
UPDATE_MAX_TOKENS = 16


def _add(y, residual):
    return y if residual is None else y + residual


def ordered_step(x, kernel, bias, *, activation, residual, state, backend):
    """x (B, L, D), state (B, W-1, D) -> (y, new state)."""
    W, L = kernel.shape[-1], x.shape[1]
    if L <= UPDATE_MAX_TOKENS:
        y, new = causal_conv1d_update(x, state, kernel, bias, activation=activation,
                                      channels_last=True, backend=backend)
        return _add(y, residual), new
    if W == 1:  # no history to carry
        return causal_conv1d(x, kernel, bias, activation=activation, residual=residual,
                             channels_last=True, backend=backend), state
    y, final = causal_conv1d(x, kernel, bias, activation=activation, residual=residual,
                             initial_states=state.astype(x.dtype), return_final_states=True,
                             channels_last=True, backend=backend)
    return y, final.astype(state.dtype)


def ring_positions(seen, start, n, state_len):
    """(B, n) ring entries of tokens ``seen + start .. seen + start + n - 1``."""
    return jnp.mod(seen[:, None] + start + jnp.arange(n, dtype=seen.dtype)[None, :],
                   max(state_len, 1))


def ring_window(ring, seen, n):
    """The last ``n`` committed inputs of each row, oldest first: (B, n, D)."""
    pos = ring_positions(seen, -n, n, ring.shape[1])
    return jnp.take_along_axis(ring, pos[:, :, None], axis=1)


def ring_step(x, kernel, bias, *, activation, residual, ring, seen, backend):
    """x (B, L, D) after ``seen`` (B,) committed tokens, ring (B, W-1+K, D) ->
    (y, new ring). The tokens are written, not committed (the caller advances)."""
    W, (B, L, _), SL = kernel.shape[-1], x.shape, ring.shape[1]
    if L <= UPDATE_MAX_TOKENS:
        y, new = causal_conv1d_update(x, ring, kernel, bias, activation=activation,
                                      cache_seqlens=seen, channels_last=True, backend=backend)
        return _add(y, residual), new
    # Prefill: the full convolution from the ring's last W-1 inputs, then the
    # newest inputs go to their ring entries (all state_len of them, so that a
    # later accept() may reject up to K of these tokens too).
    init = ring_window(ring, seen, W - 1).astype(x.dtype) if W > 1 else None
    y = causal_conv1d(x, kernel, bias, activation=activation, residual=residual,
                      initial_states=init, channels_last=True, backend=backend)
    m = min(L, SL)
    if m:
        pos = ring_positions(seen, L - m, m, SL)
        ring = ring.at[jnp.arange(B)[:, None], pos].set(x[:, L - m:].astype(ring.dtype),
                                                        unique_indices=True)
    return y, ring


def commit(seen, step_tokens, tokens):
    """A ring step of ``tokens`` tokens: -> (cache_seqlens, step_tokens) after
    it; the first is also the stream length the step's update reads (the kept
    tokens of the last step committed)."""
    return seen + step_tokens, jnp.full(step_tokens.shape, tokens, step_tokens.dtype)


def accept(seen, step_tokens, num_accepted):
    """Keep the first ``num_accepted`` (clipped to [0, step_tokens]) tokens of
    the last step: -> (seen, step_tokens). Idempotent."""
    n = jnp.clip(jnp.asarray(num_accepted, step_tokens.dtype), 0, step_tokens)
    return seen, jnp.broadcast_to(n, step_tokens.shape)
