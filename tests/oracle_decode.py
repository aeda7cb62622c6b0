"""Independent float64 numpy loops for decoding, written from SPEC.md's
causal_conv1d_update / causal_conv1d_varlen_states lines and sharing no code
with jax_causal_conv. Channels-first only, (B, D, S) and (N, D, state_len);
tests transpose for the channels-last layout."""

import numpy as np


def update(x, state, w, b=None, act=None, cache_seqlens=None, conv_state_indices=None):
    """One decoding step, token by token: returns (y (B, D, S), new state).

    A row's state is the stream of inputs it has seen. Rolling (no
    cache_seqlens): entry SL-1 is the newest input, SL-2 the one before...
    Circular: the input that was the stream's token number t sits at entry
    t mod SL, and cache_seqlens[b] tokens have been written. Row b uses slot
    conv_state_indices[b] (default b); a negative slot is a padding row (y = 0, no write)."""
    x = np.asarray(x, np.float64)
    state = np.array(state, np.float64)  # a copy: the new state
    w = np.asarray(w, np.float64)
    B, D, S = x.shape
    SL = state.shape[2]
    W = w.shape[1]
    y = np.zeros((B, D, S))
    for bi in range(B):
        slot = bi if conv_state_indices is None else int(conv_state_indices[bi])
        if slot < 0:
            continue
        row = state[slot]
        if cache_seqlens is None:
            # the history as a list, oldest first; each token is appended
            stream = [row[:, j].copy() for j in range(SL)]
            for s in range(S):
                stream.append(x[bi, :, s])
                window = [np.zeros(D)] * max(0, W - len(stream)) + stream[len(stream) - W:]
                acc = np.zeros(D) if b is None else np.asarray(b, np.float64).copy()
                for k in range(W):
                    acc += w[:, k] * window[k]
                y[bi, :, s] = acc / (1 + np.exp(-acc)) if act == "silu" else acc
            for j in range(SL):
                row[:, j] = stream[len(stream) - SL + j]
        else:
            c = int(cache_seqlens[bi])
            for s in range(S):
                t = c + s  # this token's number in the stream
                acc = np.zeros(D) if b is None else np.asarray(b, np.float64).copy()
                for k in range(W - 1):  # taps on earlier tokens, read from the ring
                    acc += w[:, k] * row[:, (t - (W - 1) + k) % SL]
                acc += w[:, W - 1] * x[bi, :, s]
                y[bi, :, s] = acc / (1 + np.exp(-acc)) if act == "silu" else acc
                if SL:
                    row[:, t % SL] = x[bi, :, s]  # written after its own output
    return y, state


def stream(x, w, b=None, act=None):
    """The full causal conv of one (D, L) stream from zero history, (D, L)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    D, L = x.shape
    W = w.shape[1]
    xp = np.concatenate([np.zeros((D, W - 1)), x], axis=1)
    y = np.zeros((D, L))
    for t in range(L):
        acc = np.zeros(D) if b is None else np.asarray(b, np.float64).copy()
        for k in range(W):
            acc += w[:, k] * xp[:, t + k]
        y[:, t] = acc / (1 + np.exp(-acc)) if act == "silu" else acc
    return y
