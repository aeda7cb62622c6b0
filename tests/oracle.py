"""Independent float64 numpy loops written straight from docs/semantics.md's formulas,
sharing no code with jax_causal_conv. Layout: (B, D, L) only; tests transpose."""

import numpy as np


def silu(v):
    return v / (1.0 + np.exp(-v))


def conv(x, w, b=None, act=None, residual=None, seq_idx=None, init=None):
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    B, D, L = x.shape
    W = w.shape[1]
    y = np.zeros((B, D, L))
    xp = np.zeros((B, D, W - 1 + L))
    if init is not None:
        xp[:, :, : W - 1] = np.asarray(init, np.float64)
    xp[:, :, W - 1 :] = x
    for bi in range(B):
        for t in range(L):
            acc = np.zeros(D) if b is None else np.asarray(b, np.float64).copy()
            for k in range(W):
                src = t - (W - 1) + k
                if seq_idx is not None and (src < 0 or seq_idx[bi, src] != seq_idx[bi, t]):
                    continue
                acc += w[:, k] * xp[bi, :, t + k]
            y[bi, :, t] = silu(acc) if act == "silu" else acc
    if residual is not None:
        y += np.asarray(residual, np.float64)
    final = xp[:, :, L:]
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
