"""Independent float64 numpy loops written straight from the formulas of
docs/semantics.md (the project's copy of the SPEC),
sharing no code with jax_causal_conv. Layout: (B, D, L) only; tests transpose."""

import numpy as np


def silu(v):
    return v / (1.0 + np.exp(-v))


def conv(x, w, b=None, act=None, residual=None, seq_idx=None, init=None):
    """y and final states, (B, D, L) and (B, D, W-1). With seq_idx: a tap counts
    when its input's id equals the output's (history positions t' < 0 carry
    seq_idx[b, 0] with init, count as zeros without); negative ids are padding
    (output 0 before the residual); final states are the last W-1 inputs of the
    row's last non-padding sequence ending at its last valid token."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    B, D, L = x.shape
    W = w.shape[1]
    H = W - 1
    y = np.zeros((B, D, L))
    xp = np.zeros((B, D, H + L))
    if init is not None:
        xp[:, :, :H] = np.asarray(init, np.float64)
    xp[:, :, H:] = x

    def sid(bi, p):  # the id of xp position p (p < 0: history), or None: never counts
        if p >= 0:
            return int(seq_idx[bi, p])
        return int(seq_idx[bi, 0]) if init is not None else None

    for bi in range(B):
        for t in range(L):
            if seq_idx is not None and seq_idx[bi, t] < 0:
                continue  # padding: 0
            acc = np.zeros(D) if b is None else np.asarray(b, np.float64).copy()
            for k in range(W):
                src = t - H + k
                if seq_idx is not None and sid(bi, src) != int(seq_idx[bi, t]):
                    continue
                acc += w[:, k] * xp[bi, :, t + k]
            y[bi, :, t] = silu(acc) if act == "silu" else acc
    if residual is not None:
        y += np.asarray(residual, np.float64)
    if seq_idx is None:
        return y, xp[:, :, L:]
    final = np.zeros((B, D, H))
    for bi in range(B):
        valid = [t for t in range(L) if seq_idx[bi, t] >= 0]
        if not valid:
            final[bi] = xp[bi, :, :H]
            continue
        e = valid[-1] + 1
        s = int(seq_idx[bi, e - 1])
        for j in range(H):
            p = e - H + j
            if sid(bi, p) == s:
                final[bi, :, j] = xp[bi, :, p + H]
    return y, final


def varlen(x, w, b, cu, act=None, init=None):
    """x (T, D): each sequence separately through conv()."""
    x = np.asarray(x, np.float64)
    T, D = x.shape
    W = w.shape[1]
    y = np.zeros((T, D))
    finals = []
    for n in range(len(cu) - 1):
        s, e = cu[n], cu[n + 1]
        ys, fs = conv(x[s:e].T[None], w, b, act, init=None if init is None else init[n : n + 1])
        y[s:e] = ys[0].T
        finals.append(fs[0])
    return y, np.stack(finals) if finals else np.zeros((0, D, W - 1))


def varlen_states(x, cu, state_len):
    x = np.asarray(x, np.float64)
    N, D = len(cu) - 1, x.shape[1]
    out = np.zeros((N, D, state_len))
    for n in range(N):
        seq = x[cu[n] : cu[n + 1]]
        take = min(state_len, len(seq))
        if take:
            out[n, :, state_len - take :] = seq[len(seq) - take :].T
    return out
