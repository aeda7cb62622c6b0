"""The same functions in plain jax.numpy: the semantics of docs/semantics.md,
written as shifted sums. Used by the tests, and as the pure-XLA backend (``backend="xla"``)
where no kernel exists; gradients come from JAX's autodiff."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import validation as V

__all__ = [
    "causal_conv1d",
    "causal_conv1d_varlen",
    "causal_conv1d_update",
    "causal_conv1d_varlen_states",
]


def _acc_dtype(dtype):
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _act(v, activation):
    return jax.nn.silu(v) if activation == "silu" else v


def _conv_taps(xp, weight, bias, L, mask=None):
    """bias + sum_k weight[:, k] * xp[..., t + k] over (..., D, L + W - 1) -> (..., D, L)."""
    W = weight.shape[-1]
    acc = jnp.zeros(xp.shape[:-1] + (L,), xp.dtype)
    if bias is not None:
        acc = acc + bias.astype(xp.dtype)[:, None]
    for k in range(W):
        xs = xp[..., k : k + L]
        if mask is not None:  # (the inputs masked, not the products: no 0 * Inf in the gradients)
            xs = jnp.where(mask[k], xs, 0)
        acc = acc + weight[:, k, None].astype(xp.dtype) * xs
    return acc


def _seq_masks(seq_idx, L, W, has_init):
    """Per tap k, (B, L): whether the input tap k of output t reads (at
    t' = t - (W-1) + k) has t's id; the W-1 history positions t' < 0 carry
    seq_idx[:, 0] with initial states and count as zeros without. A padding
    output reads none (its output is 0 anyway; so an Inf or NaN in padding
    reaches no gradient either)."""
    H = W - 1
    hist_id = jnp.broadcast_to(seq_idx[:, :1], (seq_idx.shape[0], H))
    ids = jnp.concatenate([hist_id, seq_idx], axis=1)      # id of every xp position
    valid = jnp.arange(L + H) >= (0 if has_init else H)   # positions that may count
    live = seq_idx >= 0
    return [((ids[:, k : k + L] == seq_idx) & valid[k : k + L] & live)[:, None, :] for k in range(W)]


def _seq_final_states(xp, seq_idx, H, has_init):
    """The last H inputs of each row's last non-padding sequence, ending at its
    last valid token: xp (B, D, H + L) -> (B, D, H)."""
    B, _, n = xp.shape
    L = n - H
    t = jnp.arange(L)
    e = jnp.max(jnp.where(seq_idx >= 0, t + 1, 0), axis=1)          # (B,) end of the last valid token
    s = jnp.take_along_axis(seq_idx, jnp.maximum(e - 1, 0)[:, None], axis=1)  # (B, 1) its id
    pos = e[:, None] - H + jnp.arange(H)[None, :]                       # (B, H) positions, may be < 0
    ids = jnp.where(pos >= 0, jnp.take_along_axis(seq_idx, jnp.clip(pos, 0, max(L - 1, 0)), axis=1),
                    seq_idx[:, :1] if L > 0 else -1)
    keep = (ids == s) & ((pos >= 0) | has_init)
    vals = jnp.take_along_axis(xp, (pos + H)[:, None, :], axis=2)         # xp index of pos
    fin = jnp.where(keep[:, None, :], vals, 0)
    # a row with no valid token keeps its initial states (or zeros)
    return jnp.where((e > 0)[:, None, None], fin, xp[..., :H])


def causal_conv1d(x, weight, bias=None, *, activation=None, residual=None, seq_idx=None,
                  initial_states=None, return_final_states=False, channels_last=False,
                  backend="xla"):
    """Reference of :func:`jax_causal_conv.causal_conv1d` (``backend`` is ignored)."""
    activation = V.check_conv(x, weight, bias, residual, seq_idx, initial_states,
                              channels_last, activation)
    if channels_last:  # compute in (B, D, L)
        x = jnp.swapaxes(x, 1, 2)
        residual = None if residual is None else jnp.swapaxes(residual, 1, 2)
        initial_states = None if initial_states is None else jnp.swapaxes(initial_states, 1, 2)
    B, D, L = x.shape
    W = weight.shape[-1]
    H = W - 1
    acc_t = _acc_dtype(x.dtype)
    has_init = initial_states is not None
    hist = (initial_states.astype(acc_t) if has_init else jnp.zeros((B, D, H), acc_t))
    xp = jnp.concatenate([hist, x.astype(acc_t)], axis=-1)
    mask = None if seq_idx is None else _seq_masks(seq_idx, L, W, has_init)
    y = _act(_conv_taps(xp, weight, bias, L, mask), activation)
    if seq_idx is not None:  # padding: exactly 0 before the residual
        y = jnp.where((seq_idx >= 0)[:, None, :], y, 0)
    if residual is not None:
        y = y + residual.astype(acc_t)
    y = y.astype(x.dtype)
    if seq_idx is None:
        final = xp[..., L:]
    else:
        final = _seq_final_states(xp, seq_idx, H, has_init)
    final = final.astype(x.dtype)
    if channels_last:
        y, final = jnp.swapaxes(y, 1, 2), jnp.swapaxes(final, 1, 2)
    return (y, final) if return_final_states else y


def _varlen_taps(x, cu_seqlens, initial_states, W):
    """For packed x (T, D): xs[k] = the input tap k of every output reads, (T, D)."""
    T = x.shape[0]
    t = jnp.arange(T)
    seq = jnp.clip(jnp.searchsorted(cu_seqlens[1:], t, side="right"), 0, cu_seqlens.shape[0] - 2)
    start = cu_seqlens[seq]
    taps = []
    for k in range(W):
        src = t - (W - 1) + k
        inside = src >= start
        v = jnp.where(inside[:, None], x[jnp.clip(src, 0, max(T - 1, 0))], 0)
        if initial_states is not None and W > 1:
            j = jnp.clip(W - 1 + src - start, 0, W - 2)  # history slot
            h = initial_states[seq, :, j]                  # (T, D)
            v = jnp.where(inside[:, None], v, h)
        taps.append(v)
    return taps


def varlen_final_states(x, cu_seqlens, initial_states, state_len, channels_last=False):
    """Last ``state_len`` inputs of each sequence of ``concat(initial_states, x_seq)``:
    (N, D, state_len), or (N, state_len, D) with ``channels_last`` (the
    ``initial_states`` are (N, D, W-1) either way)."""
    N = cu_seqlens.shape[0] - 1
    T, D = x.shape
    lo, hi = cu_seqlens[:-1], cu_seqlens[1:]
    pos = hi[:, None] - state_len + jnp.arange(state_len)[None, :]  # (N, S)
    inside = pos >= lo[:, None]
    v = x[jnp.clip(pos, 0, max(T - 1, 0))] if T > 0 else jnp.zeros((N, state_len, D), x.dtype)
    v = jnp.where(inside[..., None], v, 0)                          # (N, S, D)
    if initial_states is not None and initial_states.shape[-1] > 0:
        Wm1 = initial_states.shape[-1]
        j = jnp.clip(Wm1 + pos - lo[:, None], 0, Wm1 - 1)
        h = jnp.take_along_axis(initial_states, j[:, None, :], axis=2)
        v = jnp.where(inside[..., None], v, jnp.swapaxes(h, 1, 2))
    v = v.astype(x.dtype)                                           # (N, S, D)
    return v if channels_last else jnp.swapaxes(v, 1, 2)


def causal_conv1d_varlen(x, weight, bias=None, *, cu_seqlens, activation=None,
                         initial_states=None, return_final_states=False, backend="xla"):
    """Reference of :func:`jax_causal_conv.causal_conv1d_varlen`."""
    activation = V.check_varlen(x, weight, bias, cu_seqlens, initial_states, activation)
    T, D = x.shape
    W = weight.shape[-1]
    acc_t = _acc_dtype(x.dtype)
    init = None if initial_states is None else initial_states.astype(acc_t)
    acc = jnp.zeros((T, D), acc_t)
    if bias is not None:
        acc = acc + bias.astype(acc_t)
    if T > 0:
        for k, v in enumerate(_varlen_taps(x.astype(acc_t), cu_seqlens, init, W)):
            acc = acc + weight[:, k].astype(acc_t) * v
    y = _act(acc, activation).astype(x.dtype)
    if not return_final_states:
        return y
    return y, varlen_final_states(x, cu_seqlens, initial_states, W - 1)


def causal_conv1d_varlen_states(x, cu_seqlens, state_len, *, channels_last=False,
                                backend="xla"):
    """Reference of :func:`jax_causal_conv.causal_conv1d_varlen_states`."""
    V.check_varlen_states(x, cu_seqlens, state_len, channels_last)
    return varlen_final_states(x, cu_seqlens, None, state_len, channels_last)


def causal_conv1d_update(x, conv_state, weight, bias=None, *, activation=None,
                         cache_seqlens=None, conv_state_indices=None, channels_last=False,
                         backend="xla"):
    """Reference of :func:`jax_causal_conv.causal_conv1d_update`.

    Computed channels-first; with ``channels_last`` only the rows the batch
    touches (and x, y) are transposed, never the whole slot pool."""
    activation = V.check_update(x, conv_state, weight, bias, cache_seqlens,
                                conv_state_indices, activation, channels_last)
    single = x.ndim == 2
    if single:
        x = x[..., None]
    elif channels_last:
        x = jnp.swapaxes(x, 1, 2)
    B, D, S = x.shape
    N = conv_state.shape[0]
    SL = conv_state.shape[1] if channels_last else conv_state.shape[2]
    W = weight.shape[-1]
    acc_t = _acc_dtype(x.dtype)
    slots = jnp.arange(B) if conv_state_indices is None else conv_state_indices
    pad = (slots < 0) | (slots >= N)
    safe = jnp.clip(slots, 0, max(N - 1, 0))
    st = conv_state[safe]                                      # (B, D, SL) or (B, SL, D)
    if channels_last:
        st = jnp.swapaxes(st, 1, 2)
    if cache_seqlens is None:
        hist = st[..., SL - (W - 1):]
    else:
        idx = jnp.mod(cache_seqlens[:, None] - (W - 1) + jnp.arange(W - 1)[None, :], max(SL, 1))
        hist = jnp.take_along_axis(st, idx[:, None, :], axis=2)
    xp = jnp.concatenate([hist.astype(acc_t), x.astype(acc_t)], axis=-1)
    y = _act(_conv_taps(xp, weight, bias, S), activation)
    y = jnp.where(pad[:, None, None], 0, y).astype(x.dtype)
    # the new state: the newest SL entries of the stream, written in place
    if cache_seqlens is None:
        new_rows = jnp.concatenate([st, x.astype(st.dtype)], axis=-1)[..., S:]
    elif SL > 0 and S > 0:
        pos = jnp.mod(cache_seqlens[:, None] + jnp.arange(S)[None, :], SL)     # (B, S)
        keep = jnp.arange(S)[None, :] >= S - SL                                 # last SL only
        onehot = (jnp.arange(SL)[None, None, :] == pos[:, :, None]) & keep[:, :, None]  # (B,S,SL)
        # each ring entry is written by at most one token: select it (a gather,
        # no arithmetic, so NaN/Inf in one token cannot reach other entries)
        src = jnp.argmax(onehot, axis=1)                                         # (B, SL)
        written = jnp.take_along_axis(x, src[:, None, :], axis=2).astype(st.dtype)
        new_rows = jnp.where(onehot.any(axis=1)[:, None, :], written, st)
    else:
        new_rows = st
    if channels_last:
        new_rows, y = jnp.swapaxes(new_rows, 1, 2), (y if single else jnp.swapaxes(y, 1, 2))
    target = jnp.where(pad, N, safe)  # padding rows write nowhere (dropped index)
    new_state = conv_state.at[target].set(new_rows, mode="drop")
    return (y[..., 0] if single else y), new_state
