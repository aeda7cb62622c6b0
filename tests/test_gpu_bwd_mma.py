"""The tensor-core backward (cuda/backward_mma.cu: the plan's at W 8,
JCC_BWD_MMA=1 takes it at every W, =0 never): channels-first rows of
bfloat16 x, one sequence per row, 2 <= W <= 8. Against the CPU kernels (and
the streaming backward, JCC_BWD_MMA=0, on the non-finite cases):
widths 2..8, spans of one and of eight chunks of 512 steps
(JCC_BWD_MMA_SPAN; the g after a chunk handed over from the chunk walked
before it), rows that end inside a chunk and inside a tile, initial and
final states, a residual, no bias, float32 weights (split into two bfloat16
parts), vmapped weights, and Inf / NaN inputs and cotangents (an exact
re-sum of the tiles they reach)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_causal_conv as jcc

from gpu_support import CPU, GPU, MARKS, check, grads, inputs, run

pytestmark = MARKS

# (B, D, L): L = 520 one chunk and 8 steps; 1032 two chunks and a tile's 8
# steps; 4104 eight chunks and 8 steps (a span of eight, then one of a
# partial chunk); 3000 a row ending inside a tile.
SHAPES = [(2, 12, 520), (1, 8, 1032), (1, 4, 4104), (2, 4, 3000)]


@pytest.mark.parametrize("W", range(2, 9))
@pytest.mark.parametrize("span", ["1", "8"])
def test_small_mma_backward(monkeypatch, W, span):
    monkeypatch.setenv("JCC_BWD_MMA", "1")
    monkeypatch.setenv("JCC_BWD_MMA_SPAN", span)
    rng = np.random.default_rng(W + 10 * int(span))
    for (B, D, L) in SHAPES:
        x, w, b, init = inputs(rng, B, D, L, W, "bfloat16", False)
        res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
        for act in (None, "silu"):
            f = lambda x, w, b, r, s: jcc.causal_conv1d(
                x, w, b, activation=act, residual=r, initial_states=s, return_final_states=True,
                backend="ffi")
            check(grads(f, (0, 1, 2, 3, 4)), (x, w, b, res, init), "bfloat16", f"mma bwd {act} {B, D, L}")
        f3 = lambda x, w: jcc.causal_conv1d(x, w, backend="ffi")  # no bias, no activation
        check(grads(f3, (0, 1)), (x, w), "bfloat16", f"mma bwd nobias {B, D, L}")
        w32 = jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), jnp.float32)  # split taps
        f4 = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", backend="ffi")
        check(grads(f4, (0, 1, 2)), (x, w32, b), "bfloat16", f"mma bwd f32 taps {B, D, L}")


@pytest.mark.parametrize("W", [4, 7])
def test_small_mma_backward_weight_groups(monkeypatch, W):
    monkeypatch.setenv("JCC_BWD_MMA", "1")
    rng = np.random.default_rng(W)
    x, w, b, _ = inputs(rng, 6, 16, 1032, W, "bfloat16", False)
    ws = jnp.stack([w, 2 * w, -w])
    xs = x.reshape((3, 2) + x.shape[1:])
    f = lambda xs, ws: jax.vmap(lambda x, w: jcc.causal_conv1d(x, w, b, activation="silu", backend="ffi"))(xs, ws)
    check(grads(f, (0, 1)), (xs, ws), "bfloat16", "mma bwd vmap groups")


def _grads_nonfinite(W, L):
    """Gradients of a row with Inf and NaN inputs and an Inf cotangent."""
    rng = np.random.default_rng(W)
    B, D = 2, 8
    x, w, b, _ = inputs(rng, B, D, L, W, "bfloat16", False)
    x = np.asarray(x, np.float32)
    x[0, 1, 300] = np.inf
    x[0, 2, 700] = np.nan
    x[1, 3, 127] = -np.inf     # the last step of a tile
    x[1, 4, 512] = np.inf      # the first of a chunk
    x = jnp.asarray(x, jnp.bfloat16)
    gy = np.asarray(rng.standard_normal((B, D, L)), np.float32)
    gy[1, 5, 900] = np.inf
    gy = jnp.asarray(gy, jnp.bfloat16)

    def f(x, w, b):
        y, vjp = jax.vjp(lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", backend="ffi"), x, w, b)
        return (y,) + vjp(gy)
    return f, (x, w, b)


@pytest.mark.parametrize("W", [2, 4, 8])
@pytest.mark.parametrize("span", ["1", "8"])
def test_small_mma_backward_nonfinite(monkeypatch, W, span):
    """An Inf or NaN input or cotangent reaches the same entries as in the
    streaming backward (and the CPU kernels), whose sums are tap by tap:
    every MMA tile it enters is summed again exactly."""
    monkeypatch.setenv("JCC_BWD_MMA", "1")
    monkeypatch.setenv("JCC_BWD_MMA_SPAN", span)
    f, args = _grads_nonfinite(W, 1032)
    # (a new program for each setting: one replayed from a CUDA graph would
    # keep the launch it recorded under the first)
    got = run(GPU, lambda *a: f(*a), *args)
    monkeypatch.setenv("JCC_BWD_MMA", "0")
    stream = run(GPU, lambda *a: f(*a), *args)
    cpu = run(CPU, f, *args)
    for i, (g, s, c) in enumerate(zip(got, stream, cpu)):
        g, s, c = (np.asarray(v, np.float64) for v in (g, s, c))
        for other, name in ((s, "streaming"), (c, "cpu")):
            assert np.array_equal(np.isnan(g), np.isnan(other)), (i, name, "NaN entries")
            assert np.array_equal(np.isinf(g), np.isinf(other)), (i, name, "Inf entries")
        fin = np.isfinite(c)
        scale = np.abs(c[fin]).max(initial=1.0)
        assert np.abs(g[fin] - c[fin]).max(initial=0.0) <= 3e-2 * scale, (i, "finite entries")
        if i <= 1:  # (y and dx: most entries stay finite, so the comparison above has work)
            assert fin.sum() > 0.5 * fin.size, i
