"""The adapter's functions in plain torch, written from the semantics page
(SPEC.md), for tests and as readable definitions. Accumulation in float32
(float64 if any input is float64); any layout or strides."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import validation as V

__all__ = ["causal_conv1d_ref", "causal_conv1d_update_ref", "causal_conv1d_varlen_states_ref"]

_NO_ID = -(2 ** 62)  # the id of history positions without initial states: equal to no seq_idx


def _acc_dtype(*ts):
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) \
        else torch.float32


def _position_ids(seq_idx, H, has_init):
    """(B, H + L) int64: the sequence id of every position of xp, the W-1
    history positions first (the row's first id when initial states are
    given: they belong to its first segment; else an id nothing matches)."""
    s = seq_idx.long()
    hist = s[:, :1] if has_init else torch.full_like(s[:, :1], _NO_ID)
    return torch.cat([hist.expand(-1, H), s], dim=1)


def causal_conv1d_ref(x, weight, bias=None, initial_states=None, return_final_states=False,
                      final_states_out=None, activation=None, seq_idx=None):
    """y[b,d,t] = act(bias[d] + sum_k weight[d,k] * xp[b,d,t+k]) with
    xp = concat(initial_states or zeros, x) along time (Dao's reference,
    with his argument order). With ``seq_idx`` (B, L): a tap counts only
    where the ids of its input and output positions are equal, outputs at
    ids < 0 (padding) are exactly 0, and the final states are the last W-1
    positions of the row's last segment, ending at its last non-padding
    token (zero where another segment's)."""
    act = V.check_activation(activation)
    B, D, L = x.shape
    W = weight.shape[1]
    H = W - 1
    acc = _acc_dtype(x, weight, bias, initial_states)
    hist = (initial_states.to(acc) if initial_states is not None
            else x.new_zeros((B, D, H), dtype=acc))
    xp = torch.cat([hist, x.to(acc)], dim=-1)  # position p of xp is time p - H
    w = weight.to(acc)
    y = torch.zeros((B, D, L), dtype=acc, device=x.device)
    if bias is not None:
        y = y + bias.to(acc)[None, :, None]
    ids = None if seq_idx is None else _position_ids(seq_idx, H, initial_states is not None)
    for k in range(W):
        term = w[None, :, k, None] * xp[:, :, k:k + L]
        if ids is not None:
            term = torch.where((ids[:, k:k + L] == seq_idx.long())[:, None, :], term, 0)
        y = y + term
    if act:
        y = F.silu(y)
    if seq_idx is not None:
        y = torch.where((seq_idx < 0)[:, None, :], 0, y)
    y = y.to(x.dtype)
    if not return_final_states:
        return y
    if seq_idx is None:
        fs = xp[:, :, L:]
    else:
        rows = []
        for b in range(B):
            valid = torch.nonzero(seq_idx[b] >= 0)
            if valid.numel() == 0:  # all padding: the row's history as it came
                rows.append(xp[b, :, :H])
                continue
            e = int(valid[-1]) + 1  # one past the last real token; xp[e:e+H] ends there
            keep = ids[b, e:e + H] == ids[b, e + H - 1]
            rows.append(torch.where(keep[None, :], xp[b, :, e:e + H], 0))
        fs = torch.stack(rows) if rows else xp[:, :, :H]
    fs = fs.to(x.dtype, copy=True)  # not a view of xp: callers may modify it in place
    if final_states_out is not None:
        final_states_out.copy_(fs)
        fs = final_states_out
    return y, fs


def causal_conv1d_update_ref(x, conv_state, weight, bias=None, activation=None,
                             cache_seqlens=None, conv_state_indices=None):
    """The decode step in plain torch, updating ``conv_state`` in place; the
    same as ``causal_conv1d_ref`` on the state's history followed by x."""
    act = V.check_activation(activation)
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    B, D, S = x.shape
    W = weight.shape[1]
    H = W - 1
    SL = conv_state.shape[-1]
    acc = _acc_dtype(x, weight, bias)
    ys = []
    for b in range(B):
        slot = int(conv_state_indices[b]) if conv_state_indices is not None else b
        if slot < 0:
            ys.append(torch.zeros((D, S), dtype=x.dtype, device=x.device))
            continue
        st = conv_state[slot]
        if cache_seqlens is None:
            hist = st[:, SL - H:]
            new = torch.cat([st, x[b]], dim=-1)[:, -SL:] if SL > 0 else st
        else:
            c = int(cache_seqlens[b])
            hist = st[:, [(c - H + j) % SL for j in range(H)]]
            new = st.clone()
            for s in range(S):
                new[:, (c + s) % SL] = x[b, :, s]
        xp = torch.cat([hist, x[b]], dim=-1).to(acc)
        y = torch.zeros((D, S), dtype=acc, device=x.device)
        if bias is not None:
            y = y + bias.to(acc)[:, None]
        for k in range(W):
            y = y + weight.to(acc)[:, k, None] * xp[:, k:k + S]
        if act:
            y = F.silu(y)
        ys.append(y.to(x.dtype))
        conv_state[slot].copy_(new)
    y = torch.stack(ys) if ys else x.new_empty((0, D, S))
    return y.squeeze(-1) if squeeze else y


def causal_conv1d_varlen_states_ref(x, cu_seqlens, state_len):
    """The last ``state_len`` inputs of each packed sequence, zero-padded on the left."""
    N = cu_seqlens.shape[0] - 1
    out = x.new_zeros((N, x.shape[1], state_len))
    for n in range(N):
        lo, hi = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        take = min(state_len, hi - lo)
        if take > 0:
            out[n, :, state_len - take:] = x[hi - take:hi].T
    return out
