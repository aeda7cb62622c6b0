"""Streaming: a long signal processed chunk by chunk, each chunk's final_states fed
to the next as initial_states, equals the one-shot result (and the reference)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import jax_causal_conv as jcc  # noqa: E402
from jax_causal_conv import reference  # noqa: E402

B, D, L = 2, 5, 61


def _chunks(L, sizes):
    """Cut [0, L) into pieces cycling through ``sizes``."""
    out, t, i = [], 0, 0
    while t < L:
        n = min(sizes[i % len(sizes)], L - t)
        out.append((t, t + n))
        t, i = t + n, i + 1
    return out


def _stream(x, w, b, activation, channels_last, sizes, jit):
    W = w.shape[1]
    taxis = 1 if channels_last else 2
    state_shape = (B, W - 1, D) if channels_last else (B, D, W - 1)
    state = jnp.zeros(state_shape, x.dtype)

    def step(xc, state):
        return jcc.causal_conv1d(xc, w, b, activation=activation, initial_states=state,
                                 return_final_states=True, channels_last=channels_last)

    if jit:
        step = jax.jit(step)
    ys = []
    for s, e in _chunks(x.shape[taxis], sizes):
        xc = x[:, s:e] if channels_last else x[:, :, s:e]
        y, state = step(xc, state)
        assert state.shape == state_shape
        ys.append(y)
    return jnp.concatenate(ys, axis=taxis), state


@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("W,sizes", [
    (4, [16]),          # even chunks
    (4, [1]),           # token by token
    (4, [2, 1, 7, 1]),  # odd chunk sizes, several shorter than W-1
    (7, [3, 5, 2, 11]), # chunks shorter than W-1 = 6 carry history across two chunks
    (2, [3, 1]),
])
def test_streaming_equals_one_shot(channels_last, W, sizes):
    k = jax.random.split(jax.random.key(W * 100 + len(sizes)), 3)
    shape = (B, L, D) if channels_last else (B, D, L)
    x = jax.random.normal(k[0], shape, jnp.float32)
    w = jax.random.normal(k[1], (D, W), jnp.float32) / np.sqrt(W)
    b = jax.random.normal(k[2], (D,), jnp.float32)
    one, fin = jcc.causal_conv1d(x, w, b, activation="silu", return_final_states=True,
                                 channels_last=channels_last)
    ref = reference.causal_conv1d(x, w, b, activation="silu", channels_last=channels_last)
    np.testing.assert_allclose(one, ref, rtol=1e-5, atol=1e-5)
    got, state = _stream(x, w, b, "silu", channels_last, sizes, jit=len(set(sizes)) == 1)
    np.testing.assert_allclose(got, one, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(state, fin)
    # the final state is the last W-1 inputs
    last = x[:, L - (W - 1):] if channels_last else x[:, :, L - (W - 1):]
    np.testing.assert_array_equal(state, last)


def test_streaming_short_chunks_keep_old_history():
    """A chunk shorter than W-1 keeps part of the incoming state in its final state."""
    W = 5
    x = jnp.arange(1.0, 1 + B * 2 * D).reshape(B, 2, D)  # 2 < W-1 = 4 tokens
    init = -jnp.arange(1.0, 1 + B * (W - 1) * D).reshape(B, W - 1, D)
    w = jnp.ones((D, W))
    _, fin = jcc.causal_conv1d(x, w, initial_states=init, return_final_states=True,
                               channels_last=True)
    np.testing.assert_array_equal(fin, jnp.concatenate([init[:, 2:], x], axis=1))


def test_streaming_matches_update_decode():
    """Chunked prefill, then causal_conv1d_update token by token, equals one shot."""
    W = 4
    k = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(k[0], (B, D, L), jnp.float32)
    w = jax.random.normal(k[1], (D, W), jnp.float32)
    b = jax.random.normal(k[2], (D,), jnp.float32)
    one = reference.causal_conv1d(x, w, b, activation="silu")
    P = 10
    y0, state = jcc.causal_conv1d(x[:, :, :P], w, b, activation="silu",
                                  return_final_states=True)
    ys = [y0]
    for t in range(P, L):
        y, state = jcc.causal_conv1d_update(x[:, :, t], state, w, b, activation="silu")
        ys.append(y[:, :, None])
    np.testing.assert_allclose(jnp.concatenate(ys, axis=2), one, rtol=1e-5, atol=1e-5)


def _doc_blocks(name):
    import os
    import re
    path = os.path.join(os.path.dirname(__file__), "..", "docs", name)
    return re.findall(r"```python\n(.*?)```", open(path, encoding="utf-8").read(), flags=re.S)


@pytest.mark.parametrize("i", range(len(_doc_blocks("streaming.md"))))
def test_streaming_doc_examples_run(i):
    """Every python block of docs/streaming.md runs (its asserts check itself)."""
    code = _doc_blocks("streaming.md")[i]
    if "flax" in code:
        pytest.importorskip("flax")
    exec(compile(code, f"docs/streaming.md[python block {i}]", "exec"), {})
