"""The tensor-core forwards (cuda/forward_mma.cu: channels-first rows of
16-bit x; cuda/forward_mma_cl.cu: channels-last groups of channels) at the
edges of their k-step buckets, against the float64 oracle and the CPU
kernels: weights of x's dtype and of float32, non-finite inputs, several
spans. Skipped unless a GPU is visible and the CUDA module was built; names
containing "small" join the reduced grid (tests/test_gpu.py)."""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_causal_conv as jcc

from gpu_support import GPU, MARKS, check, grads, inputs, rel_err, run
from helpers import swap_layout
import oracle

pytestmark = MARKS


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("W", [16, 17, 24, 40, 41, 72, 73, 136, 137, 256])
@pytest.mark.parametrize("cl", [False, True])
def test_small_mma_forward(dtype, W, cl):
    """The tensor-core forwards (forward_mma.cu: channels-first rows of
    16-bit x, W > 16; forward_mma_cl.cu: channels-last groups of 16 or 8
    channels, W > 16; both one sequence per row or seq_idx; W 13 and 16
    take the streaming and the channels-last row kernels)
    at the edges of their k-step buckets: weights of
    x's dtype and of float32 (two 16-bit parts), bias, SiLU, residual,
    initial states, a partial last tile and chunk, vmapped weights; against
    the float64 oracle and, with gradients, the CPU kernels."""
    rng = np.random.default_rng(W + cl)
    # two chunks of 512 steps and a partial tile; channels-last: groups of 16
    # channels (odd W <= 40) or of 8
    B, D, L = 2, (16 if W % 2 else 24) if cl else 3, 1160
    x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
    res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    w32 = jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), jnp.float32)
    tol = {"bfloat16": 8e-3, "float16": 1.5e-3}[dtype]  # the output's rounding
    conv = functools.partial(jcc.causal_conv1d, channels_last=cl, backend="ffi")
    cf = functools.partial(swap_layout, cl=cl)

    def want(x, w, b=None, act=None, r=None, h=None):  # the oracle, channels-first
        y, fin = oracle.conv(cf(x), w, b, act, cf(r), init=cf(h))
        return cf(y), cf(fin)

    for wt in (w, w32):
        y, fin = run(GPU, lambda *a: conv(*a[:3], activation="silu", residual=a[3], initial_states=a[4],
                                          return_final_states=True), x, wt, b, res, init)
        want_y, want_fin = want(x, wt, b, "silu", res, init)
        assert rel_err(y, want_y) <= tol, (str(wt.dtype), rel_err(y, want_y))
        assert rel_err(fin, want_fin) == 0
        y = run(GPU, conv, x, wt)
        assert rel_err(y, want(x, wt)[0]) <= tol, str(wt.dtype)
    # seq_idx: segments, padding, an id that returns, the history's id
    ids = np.zeros((B, L), np.int32)
    ids[:, 300:] = 1
    ids[:, 301:305] = -1
    ids[:, 700:900] = 2
    ids[0, 900:1000] = 0
    ids[1, 640:] = np.arange(L - 640) // 7 + 5  # short segments: several ids in a tile
    ids[:, -20:] = -1
    for wt in (w, w32):
        y = run(GPU, lambda *a: conv(*a[:3], activation="silu", residual=a[3], initial_states=a[4],
                                     seq_idx=jnp.asarray(ids)), x, wt, b, res, init)
        want_y = cf(oracle.conv(cf(x), wt, b, "silu", cf(res), seq_idx=ids, init=cf(init))[0])
        assert rel_err(y, want_y) <= tol, ("seq_idx", str(wt.dtype), rel_err(y, want_y))
    f = lambda x, w, b, r: conv(x, w, b, activation="silu", residual=r)
    check(grads(f, (0, 1, 2, 3)), (x, w32, b, res), dtype, "mma, float32 weights")
    wv = jnp.stack([w, w[:, ::-1]])  # a vmapped weight: groups = 2
    yv = run(GPU, jax.vmap(lambda x, w: conv(x[None], w, b)[0]), x, wv)
    for g in range(2):
        assert rel_err(yv[g], want(x[g:g + 1], wv[g], b)[0][0]) <= tol


@pytest.mark.parametrize("W", [17, 33, 40, 72, 137, 256])
@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("fix_max_w", ["0", "257"])
def test_small_mma_seq_idx_orders(W, cl, fix_max_w, monkeypatch):
    """seq_idx through the tensor-core forwards, each id layout a row:
    ascending ids from 3 with gaps in their values and a padded tail,
    segments shorter than the window (several ids in one), leading padding
    (ids that do not ascend), boundaries at and beside tile and chunk edges
    and at the edges of the tiles' windows (P = W - 1 rounded up to 8 steps
    before a tile), an id that returns, changes whose last affected output
    is the last or first of a 512-step chunk (forward_seq_fix.cu's blocks);
    with and without initial states (the steps before the row then carry
    no id); against the float64 oracle. Both ways a seq_idx forward can
    run: the masked tile loops (JCC_SEQ_FIX_MAX_W=0) and the dense kernel
    plus the fix (257: every width)."""
    monkeypatch.setenv("JCC_SEQ_FIX_MAX_W", fix_max_w)  # (read at each call)
    rng = np.random.default_rng(100 + W + cl)
    B, D, L = 7, (16 if W % 2 else 24) if cl else 3, 1160
    x, w, b, init = inputs(rng, B, D, L, W, "bfloat16", cl)
    ids = np.zeros((B, L), np.int32)
    cuts = np.cumsum([5, 30, 200, 7, 1, 90, 300, 2, 60])
    ids[0] = 3 + 2 * np.searchsorted(cuts, np.arange(L), side="right")
    ids[0, -37:] = -1
    ids[1] = np.searchsorted(np.cumsum(rng.integers(1, W, 200)), np.arange(L), side="right")
    ids[2, :50] = -1
    ids[2, 50:] = 1 + np.arange(L - 50) // 150
    ids[2, -5:] = -1
    ids[3] = np.searchsorted([511, 512, 640, 641, 1023, 1024], np.arange(L), side="right")
    ids[4] = np.arange(L) // 100 % 3  # ids that return
    ids[5] = (np.arange(L) + (W + 6) // 8 * 8) // 128  # boundaries at the tiles' window edges
    ids[6] = np.searchsorted([513 - W, 514 - W, 1025 - W, 1030], np.arange(L), side="right")
    conv = functools.partial(jcc.causal_conv1d, channels_last=cl, backend="ffi", seq_idx=jnp.asarray(ids))
    cf = functools.partial(swap_layout, cl=cl)
    for h in (None, init):
        y = run(GPU, lambda *a: conv(*a[:3], activation="silu", initial_states=a[3]), x, w, b, h)
        want = cf(oracle.conv(cf(x), w, b, "silu", seq_idx=ids, init=cf(h))[0])
        for r in range(B):
            assert rel_err(y[r], want[r]) <= 8e-3, (r, h is None, rel_err(y[r], want[r]))


def test_small_mma_forward_keeps_low_weight_bits():
    """float32 weights beside bfloat16 x: the tensor-core forward splits them
    into two bfloat16 parts. With tap H = 1 + 2^-12 (not a bfloat16) and the
    residual -x, y = 2^-12 x survives only through the low part."""
    rng = np.random.default_rng(5)
    B, D, L, W = 1, 4, 1024, 33
    x = jnp.asarray(rng.standard_normal((B, D, L)), jnp.bfloat16)
    w = np.zeros((D, W), np.float32)
    w[:, -1] = 1 + 2.0 ** -12
    y = run(GPU, lambda x, w: jcc.causal_conv1d(x, w, residual=-x, backend="ffi"), x, jnp.asarray(w))
    want = np.asarray(x, np.float64) * 2.0 ** -12
    assert np.max(np.abs(y - want)) <= 2.0 ** -8 * np.max(np.abs(want))


@pytest.mark.parametrize("W", [13, 16, 17, 24, 40])
@pytest.mark.parametrize("cl", [False, True])
def test_small_mma_nonfinite_stays_in_its_windows(W, cl):
    """An Inf or NaN input reaches only the outputs whose window holds it (as
    in the reference), through the tensor-core forwards (whose MMAs would
    multiply it by the zero taps of other outputs: 0 * Inf = NaN); NaN in
    padding stays out of live outputs; float32 taps past bfloat16's range.
    (W 13 and 16 take the streaming and channels-last row kernels: the same
    rule where no zero tap is multiplied.)"""
    rng = np.random.default_rng(W + cl)
    B, D, L = 1, 16, 1040
    xn = rng.standard_normal((B, D, L)).astype(np.float32)
    xn[0, 1, 100] = np.inf
    xn[0, 2, 600] = -np.inf
    xn[0, 3, 515] = np.nan  # (next to a chunk edge)
    w = jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), jnp.bfloat16)
    t = functools.partial(swap_layout, cl=cl)
    conv = lambda x, w, **k: jcc.causal_conv1d(x, w, channels_last=cl, backend="ffi", **k)

    def same(y, want):
        y, want = t(y), np.asarray(want)
        assert np.array_equal(np.isnan(y), np.isnan(want)), np.argwhere(np.isnan(y) != np.isnan(want))[:5]
        assert np.array_equal(np.isinf(y), np.isinf(want))
        ok = np.isfinite(want)
        assert rel_err(np.where(ok, y, 0), np.where(ok, want, 0)) <= 8e-3

    x = jnp.asarray(t(xn), jnp.bfloat16)
    same(run(GPU, conv, x, w), oracle.conv(t(x), w)[0])
    big = np.zeros((D, W), np.float32)
    big[:, -1] = 3.4e38  # rounds to Inf in bfloat16
    big[:, 0] = 1.0
    xs = jnp.asarray(t(rng.standard_normal((B, D, L)) * 1e-3), jnp.bfloat16)
    same(run(GPU, conv, xs, jnp.asarray(big)), oracle.conv(t(xs), big)[0])
    # NaN in padding between and after two sequences
    ids = np.zeros((B, L), np.int32)
    ids[:, 500:] = 1
    ids[:, 480:500] = -1
    ids[:, -24:] = -1
    xp = xn.copy()
    xp[np.broadcast_to(ids[:, None, :] < 0, xp.shape)] = np.nan
    xp = jnp.asarray(t(xp), jnp.bfloat16)
    same(run(GPU, lambda x, w: conv(x, w, seq_idx=jnp.asarray(ids)), xp, w),
         oracle.conv(t(xp), w, seq_idx=ids)[0])


def test_small_float16_x_keeps_float32_weights():
    """float16 x with float32 weights far from float16's normal range (tiny
    and huge taps): the sums keep the weights' float32 precision (the
    tensor-core forward would split them into float16 parts, so these calls
    take the FMA kernels)."""
    rng = np.random.default_rng(7)
    B, D, L, W = 1, 8, 1040, 24
    for scale, xscale in ((3e-6, 1e3), (1e5, 1e-2)):  # (y stays in float16's normal range)
        x = jnp.asarray(rng.standard_normal((B, D, L)) * xscale, jnp.float16)
        w = jnp.asarray(rng.standard_normal((D, W)) * scale, jnp.float32)
        y = run(GPU, lambda x, w: jcc.causal_conv1d(x, w, backend="ffi"), x, w)
        want = oracle.conv(x, w)[0]
        err = np.max(np.abs(y - want)) / np.max(np.abs(want))
        assert err <= 2e-3, (scale, err)


@pytest.mark.parametrize("cl", [False, True])
def test_mma_forward_spans(cl):
    """A row of three warp spans (4096 steps each) through the tensor-core
    forwards, against the float64 oracle."""
    rng = np.random.default_rng(1)
    x, w, b, init = inputs(rng, 1, 8 if cl else 2, 8200, 33, "bfloat16", cl)
    y = run(GPU, lambda *a: jcc.causal_conv1d(*a[:3], activation="silu", initial_states=a[3],
                                              channels_last=cl, backend="ffi"), x, w, b, init)
    t = functools.partial(swap_layout, cl=cl)
    assert rel_err(t(y), oracle.conv(t(x), w, b, "silu", init=t(init))[0]) <= 8e-3
