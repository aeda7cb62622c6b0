"""A random speculative-decoding schedule through causal_conv1d_update on a
ring state, and the same accepted tokens fed alone (shared by
test_speculative.py on the CPU and test_serving_gpu.py on a GPU).

Each row has a true token stream. A verify step carries S tokens per row: the
row's next ``a`` true tokens (a drawn in [0, S]) followed by garbage drafts;
then ``cache_seqlens`` advances by ``a`` only. The baseline feeds each row's
accepted tokens alone, one token per call, into a fresh ring of the same size."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc


def _update(x, st, cs, idx, w, b, cl, backend):
    return jcc.causal_conv1d_update(x, st, w, b, activation="silu", cache_seqlens=cs,
                                    conv_state_indices=idx, channels_last=cl, backend=backend)


def window(state, slot, seen, W, cl):
    """The W-1 newest committed inputs of a ring slot, oldest first, (W-1, D)."""
    st = np.asarray(jnp.asarray(state[slot]).astype(jnp.float32), np.float64)
    st = st if cl else st.T                                       # (SL, D)
    return np.stack([st[(seen - (W - 1) + j) % st.shape[0]] for j in range(W - 1)]) \
        if W > 1 else np.zeros((0, st.shape[1]))


def _layout(a, cl):  # (rows, S, D) numpy -> the call's x layout
    return a if cl else np.swapaxes(a, 1, 2)


def run(rng, *, B, D, W, S, SL, steps, cl, dtype=jnp.float32, slots=False, device=None,
        backend="auto"):
    """-> dict: streams (B, T, D), accepted (B,), spec/base outputs per row
    ((n_b, D) each), spec/base windows per row, the final step's outputs of
    both (rows, S, D), the padding row's outputs (or None)."""
    put = (lambda a: a) if device is None else functools.partial(jax.device_put, device=device)
    N = B + 2 if slots else B
    slot_of = rng.permutation(N)[:B] if slots else np.arange(B)
    rows = B + 1 if slots else B                      # with slots: one padding row (-1)
    idx = put(jnp.asarray(np.append(slot_of, -1) if slots else slot_of, jnp.int32))
    streams = rng.standard_normal((B, (steps + 1) * S, D))
    w = put(jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), dtype))
    b = put(jnp.asarray(rng.standard_normal((D,)), dtype))
    def zeros():  # a fresh buffer each time: the calls donate their state
        return jnp.zeros((N, SL, D) if cl else (N, D, SL), dtype)
    f = jax.jit(functools.partial(_update, w=w, b=b, cl=cl, backend=backend), donate_argnums=1)

    def f32(y):
        return np.asarray(jnp.asarray(y).astype(jnp.float32), np.float64)

    # the speculative run
    state, seen, p = put(zeros()), np.zeros(rows, np.int32), np.zeros(B, np.int64)
    spec = [[] for _ in range(B)]
    pad_out = []
    for _ in range(steps):
        a = rng.integers(0, S + 1, B)
        x = rng.standard_normal((rows, S, D)) * 3     # drafts: garbage unless accepted
        for r in range(B):
            x[r, :a[r]] = streams[r, p[r]:p[r] + a[r]]
        y, state = f(put(jnp.asarray(_layout(x, cl), dtype)), state, put(jnp.asarray(seen)), idx)
        y = _layout(f32(y), cl)                       # back to (rows, S, D)
        for r in range(B):
            spec[r].append(y[r, :a[r]])
        if slots:
            pad_out.append(y[B])
        seen[:B] += a
        p += a
    out = dict(streams=streams, accepted=p.copy(), slot_of=slot_of,
               spec=[np.concatenate(s) for s in spec],
               spec_window=[window(state, slot_of[r], seen[r], W, cl) for r in range(B)],
               pad_out=np.stack(pad_out) if slots else None)
    # the baseline: the accepted tokens alone, one per call
    base_state = put(zeros())
    base = []
    for r in range(B):
        ys = []
        for t in range(p[r]):
            x1 = jnp.asarray(streams[r, t][None, None, :] if cl else streams[r, t][None, :, None],
                             dtype)
            y, base_state = f(put(x1), base_state, put(jnp.asarray([t], jnp.int32)),
                              put(jnp.asarray([slot_of[r]], jnp.int32)))
            ys.append(_layout(f32(y), cl)[0, 0])
        base.append(np.stack(ys) if ys else np.zeros((0, D)))
    out["base"] = base
    out["base_window"] = [window(base_state, slot_of[r], p[r], W, cl) for r in range(B)]
    # one more step of S true tokens on both: the rolled-back history is read
    nxt = np.zeros((rows, S, D))
    for r in range(B):
        nxt[r] = streams[r, p[r]:p[r] + S]
    xn = put(jnp.asarray(_layout(nxt, cl), dtype))
    y_spec, _ = f(xn, state, put(jnp.asarray(seen)), idx)
    base_seen = np.append(p, 0) if slots else p
    y_base, _ = f(xn, base_state, put(jnp.asarray(base_seen, jnp.int32)), idx)
    out["next_spec"], out["next_base"] = _layout(f32(y_spec), cl), _layout(f32(y_base), cl)
    out["w"], out["b"] = np.asarray(w.astype(jnp.float32), np.float64), \
        np.asarray(b.astype(jnp.float32), np.float64)
    return out
