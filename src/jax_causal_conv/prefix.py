"""Prefix-cache snapshots: each packed sequence's conv state at every block
boundary, for an engine that caches prefixes in blocks of ``block_size``
tokens (vLLM's automatic prefix caching for conv layers).

The state after a sequence's first ``e`` tokens is the last ``state_len``
inputs of ``concat(initial_states, x_seq[:e])``: a gather of ``state_len``
columns of ``x`` per boundary. It depends on neither weights nor outputs, so
it is computed here in plain XLA, beside (not inside) the convolution, and
reads only the gathered columns, never the whole of ``x`` a second time."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import validation as V

__all__ = ["causal_conv1d_varlen_block_states"]


def _check(x, cu_seqlens, state_len, block_size, max_blocks, initial_states, start_positions,
           channels_last):
    V.check_varlen_states(x, cu_seqlens, state_len, channels_last)
    for name, v, lo in (("block_size", block_size, 1), ("max_blocks", max_blocks, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    N, D = np.shape(cu_seqlens)[0] - 1, np.shape(x)[1]
    if initial_states is not None:
        V.check_float("initial_states", initial_states)
        V.check_rank("initial_states", initial_states, 3,
                     "(num_seqs, history, dim)" if channels_last else "(num_seqs, dim, history)")
        s = np.shape(initial_states)
        if s[0] != N or s[2 if channels_last else 1] != D:
            want = f"({N}, history, {D})" if channels_last else f"({N}, {D}, history)"
            raise ValueError(f"initial_states must have shape {want}, got {s}")
    if start_positions is not None:
        V.check_int("start_positions", start_positions)
        V.check_shape("start_positions", start_positions, (N,), "(num_seqs,)")


def causal_conv1d_varlen_block_states(x, cu_seqlens, state_len, *, block_size, max_blocks,
                                      initial_states=None, start_positions=None,
                                      channels_last=False):
    """The state of each packed sequence at its block boundaries.

    ``x`` (T, D) packs N sequences (``cu_seqlens`` (N+1,)). Sequence n is the
    continuation of a longer one: ``start_positions[n]`` tokens came before it
    (default 0), the last of them in ``initial_states`` (N, D, H) (newest last,
    zeros before them; absent: zeros). A block boundary is where the whole
    sequence has a multiple of ``block_size`` tokens; the m-th boundary that
    falls inside this chunk, after its first ``e`` tokens, gets snapshot m:
    the last ``state_len`` inputs of ``concat(initial_states[n], x_n[:e])``.

    Returns (N, max_blocks, D, state_len), or (N, max_blocks, state_len, D)
    with ``channels_last=True`` (``initial_states`` then (N, H, D)).
    Snapshot m of sequence n holds the boundary at
    ``(start_positions[n] // block_size + m + 1) * block_size`` tokens; where
    there is no such boundary inside the chunk (past the sequence's end) it is
    zeros. Boundaries after the first ``max_blocks`` are dropped: size
    ``max_blocks`` as ``ceil(longest chunk / block_size)`` to keep them all.
    A boundary at the chunk's start (a start position that is a multiple of
    ``block_size``) is the incoming state, not a snapshot of this chunk.
    """
    _check(x, cu_seqlens, state_len, block_size, max_blocks, initial_states, start_positions,
           channels_last)
    x = jnp.asarray(x)
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    T, D = x.shape
    N, K, M, S = cu.shape[0] - 1, int(block_size), int(max_blocks), int(state_len)
    lo, n_tok = cu[:-1], cu[1:] - cu[:-1]                               # (N,)
    start = (jnp.zeros((N,), jnp.int32) if start_positions is None
             else jnp.asarray(start_positions, jnp.int32))
    first = K - jnp.mod(start, K)                                       # in [1, K]
    ends = first[:, None] + K * jnp.arange(M, dtype=jnp.int32)[None, :]  # (N, M) tokens in
    valid = ends <= n_tok[:, None]
    p = ends[:, :, None] - S + jnp.arange(S, dtype=jnp.int32)          # (N, M, S) chunk pos
    inside = p >= 0
    rows = x[jnp.clip(lo[:, None, None] + p, 0, max(T - 1, 0))] if T else \
        jnp.zeros((N, M, S, D), x.dtype)                                # (N, M, S, D)
    out = jnp.where(inside[..., None], rows, 0)
    if initial_states is not None and np.shape(initial_states)[2 if not channels_last else 1]:
        init = jnp.asarray(initial_states).astype(x.dtype)
        if not channels_last:
            init = jnp.swapaxes(init, 1, 2)                             # (N, H, D): small
        H = init.shape[1]
        h = H + p                                                       # history slot
        hv = init[jnp.arange(N)[:, None, None], jnp.clip(h, 0, H - 1)]  # (N, M, S, D)
        out = jnp.where(inside[..., None], out, jnp.where((h >= 0)[..., None], hv, 0))
    out = jnp.where(valid[:, :, None, None], out, 0)
    return out if channels_last else jnp.swapaxes(out, 2, 3)
