"""Schedules of the CPU kernels against the reference.

Forward: work items that split a channels-last row along time (segments,
empty varlen sequences and final states across item boundaries), and
channels-first rows on both sides of the row/tile switch. Decode: the fast
single-token path (state_len == W - 1) and the general one, with odd channel
counts (tail blocks, several work items per row), circular offsets, padding
slots, weight dtypes other than x's, vmapped weights, and non-finite inputs
through silu."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_causal_conv as jcc
from jax_causal_conv import reference

from helpers import DTYPES, close, rand

pytestmark = pytest.mark.on_cpu  # the CPU kernels, also where the default device is a GPU


# --- forward -------------------------------------------------------------------

@pytest.mark.parametrize("W", [1, 4, 6])
@pytest.mark.parametrize("mode", ["row", "seq_idx"])
def test_channels_last_rows_split_along_time(W, mode):
    """D = 700: a work item covers 46 steps, so a row of 300 splits in 7."""
    rng = np.random.default_rng(W)
    B, L, D = 2, 300, 700
    x, w, b = rand(rng, (B, L, D)), rand(rng, (D, W)), rand(rng, (D,))
    res = rand(rng, (B, L, D))
    kw = dict(activation="silu", residual=res, channels_last=True, return_final_states=True)
    if mode == "row":
        kw["initial_states"] = rand(rng, (B, W - 1, D))
    else:
        kw["seq_idx"] = jnp.asarray(np.repeat([[0] * 45 + [1] * 2 + [2] * 150 + [3] * 103], B, 0),
                                    jnp.int32)
    (y, fin), (yr, finr) = jcc.causal_conv1d(x, w, b, **kw), reference.causal_conv1d(x, w, b, **kw)
    close(y, yr, jnp.float32)
    np.testing.assert_array_equal(np.asarray(fin), np.asarray(finr))


@pytest.mark.parametrize("cu", [[0, 0, 46, 46, 47, 200, 299, 300, 300], [0, 300], [0, 1, 300]])
def test_varlen_sequences_across_item_boundaries(cu):
    rng = np.random.default_rng(len(cu))
    T, D, W = 300, 700, 4
    x, w = rand(rng, (T, D)), rand(rng, (D, W))
    N = len(cu) - 1
    h = rand(rng, (N, D, W - 1))
    kw = dict(cu_seqlens=jnp.asarray(cu, jnp.int32), initial_states=h, return_final_states=True)
    (y, fin), (yr, finr) = (jcc.causal_conv1d_varlen(x, w, **kw),
                            reference.causal_conv1d_varlen(x, w, **kw))
    close(y, yr, jnp.float32)
    np.testing.assert_array_equal(np.asarray(fin), np.asarray(finr))


@pytest.mark.parametrize("L", [1, 3, 23, 24, 25, 600])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_channels_first_rows_and_tiles(L, dtype):
    rng = np.random.default_rng(L)
    B, D, W = 2, 300, 4
    dt = DTYPES[dtype]
    x, w, b = rand(rng, (B, D, L), dt), rand(rng, (D, W), dt), rand(rng, (D,), dt)
    kw = dict(activation="silu", residual=rand(rng, (B, D, L), dt),
              initial_states=rand(rng, (B, D, W - 1), dt), return_final_states=True)
    (y, fin), (yr, finr) = jcc.causal_conv1d(x, w, b, **kw), reference.causal_conv1d(x, w, b, **kw)
    close(y, yr, dt)
    np.testing.assert_array_equal(np.asarray(fin, np.float64), np.asarray(finr, np.float64))


# --- decode ----------------------------------------------------------------------

def _both(x, state, w, b, **kw):
    got = jcc.causal_conv1d_update(x, state, w, b, backend="ffi", **kw)
    want = reference.causal_conv1d_update(x, state, w, b, **kw)
    return got, want


@pytest.mark.parametrize("W", [2, 3, 4, 5])
@pytest.mark.parametrize("extra", [0, 2])  # state_len - (W - 1): 0 is the fast path
@pytest.mark.parametrize("mode", ["rolling", "circular", "indices", "indices+circular"])
def test_single_token_matches_reference(W, extra, mode):
    rng = np.random.default_rng(W * 10 + extra)
    B, D, N = 3, 1100, 5
    SL = W - 1 + extra
    x, w, b = rand(rng, (B, D)), rand(rng, (D, W)), rand(rng, (D,))
    state = rand(rng, (N, D, SL))
    kw = {}
    if "circular" in mode:
        kw["cache_seqlens"] = jnp.asarray([0, 7, -5], jnp.int32)
    if "indices" in mode:
        kw["conv_state_indices"] = jnp.asarray([4, -1, 1], jnp.int32)
    for act in (None, "silu"):
        (y, new), (yr, newr) = _both(x, state, w, b, activation=act, **kw)
        close(y, yr, jnp.float32)
        np.testing.assert_array_equal(np.asarray(new), np.asarray(newr))  # raw copies


@pytest.mark.parametrize("xd,wd", [("bfloat16", "bfloat16"), ("bfloat16", "float32"),
                                   ("float16", "float32"), ("float64", "float64"),
                                   ("float32", "bfloat16")])
@pytest.mark.parametrize("circular", [False, True])
def test_dtypes(xd, wd, circular):
    rng = np.random.default_rng(1)
    B, D, W = 4, 70, 4
    x = rand(rng, (B, D), DTYPES[xd])
    w, b = rand(rng, (D, W), DTYPES[wd]), rand(rng, (D,), DTYPES[wd])
    state = rand(rng, (B, D, W - 1), DTYPES[xd])
    kw = {"cache_seqlens": jnp.asarray([0, 1, 2, 9], jnp.int32)} if circular else {}
    (y, new), (yr, newr) = _both(x, state, w, b, activation="silu", **kw)
    close(y, yr, DTYPES[xd])
    np.testing.assert_array_equal(np.asarray(new, np.float64), np.asarray(newr, np.float64))


def test_vmapped_weights():
    rng = np.random.default_rng(2)
    G, B, D, W = 3, 2, 80, 4
    x, state = rand(rng, (G, B, D)), rand(rng, (G, B, D, W - 1))
    w, b = rand(rng, (G, D, W)), rand(rng, (G, D))

    def run(backend):
        f = lambda x, s, w, b: jcc.causal_conv1d_update(x, s, w, b, activation="silu",  # noqa: E731
                                                         backend=backend)
        return jax.vmap(f)(x, state, w, b)
    (y, new), (yr, newr) = run("ffi"), run("xla")
    close(y, yr, jnp.float32)
    np.testing.assert_array_equal(np.asarray(new), np.asarray(newr))


def test_silu_non_finite_and_extreme_values_like_the_reference():
    vals = jnp.asarray([0.0, -0.0, 1.0, -1.0, 20.0, -20.0, 87.5, -87.5, 90.0, -90.0, 1e30,
                        -1e30, jnp.inf, -jnp.inf, jnp.nan, 1e-30], jnp.float32)
    D, W = vals.shape[0], 2
    x = vals[None]
    w = jnp.zeros((D, W)).at[:, -1].set(1.0)  # y = silu(x)
    state = jnp.zeros((1, D, W - 1))
    (y, _), (yr, _) = _both(x, state, w, None, activation="silu")
    y, yr = np.asarray(y), np.asarray(yr)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(yr))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(yr))
    ok = np.isfinite(yr)
    np.testing.assert_allclose(y[ok], yr[ok], rtol=2e-6, atol=1e-30)


@pytest.mark.parametrize("cl", [False, True])
def test_bfloat16_outputs_round_like_the_reference(cl):
    """The rounding of float sums to bfloat16 outputs (on CPUs with
    AVX512-BF16 by the conversion instruction: cpu/narrow_bf16.h) equals
    the reference's value for value, over random bit patterns: ties (about
    one product in 256), sums that overflow to Inf, Inf and NaN inputs,
    denormal inputs and products. W = 1, no bias: y = x * w, exact in
    float32 before rounding unless it underflows (XLA:CPU flushes denormal
    results to zero, and so do our kernels under it: both give 0 there)."""
    rng = np.random.default_rng(7)
    B, D, L = 2, 45, 1043  # (runs that are not whole vectors of 16)
    bits = rng.integers(0, 1 << 16, (B, D, L), dtype=np.uint32).astype(np.uint16)
    bits[0, :, :4] = [0x0001, 0x8003, 0x007f, 0x0080]   # denormal / smallest normal inputs
    bits[1, :, :2] = [0x7f80, 0x7fc1]                   # inf, nan
    x = jnp.asarray(bits.view(jnp.bfloat16))
    wb = rng.integers(0x3c00, 0x4400, (D, 1), dtype=np.uint32).astype(np.uint16)
    wb[:8, 0] = [0x0001, 0x00ff, 0x3f81, 0x7f7f, 0x8001, 0x3fff, 0x0100, 0x2000]
    w = jnp.asarray(wb.view(jnp.bfloat16))
    if cl:
        x = jnp.swapaxes(x, 1, 2)
    y = np.asarray(jcc.causal_conv1d(x, w, channels_last=cl, backend="ffi").astype(jnp.float32))
    yr = np.asarray(reference.causal_conv1d(x, w, channels_last=cl).astype(jnp.float32))
    np.testing.assert_array_equal(y, yr)  # (NaN where the reference has NaN; -0 == 0)
    assert np.isinf(y).sum() > 100 and np.isnan(y).sum() > 100


@pytest.mark.parametrize("cl", [False, True])
def test_float16_conversions_are_exact(cl):
    """float16 in and out (by F16C in the kernels' avx2 variant, by bit
    arithmetic elsewhere: cpu/helpers.inc) over random bit patterns: x * w
    at W = 1 without bias is exact in float32 (11-bit by 11-bit products,
    far from float32's denormals), so y is that product rounded once to
    float16: ties, overflow to Inf, float16 subnormal inputs and results,
    Inf and NaN. Against the reference and numpy's own rounding."""
    rng = np.random.default_rng(11)
    B, D, L = 2, 37, 1045  # (runs that are not whole vectors of 8)
    bits = rng.integers(0, 1 << 16, (B, D, L), dtype=np.uint32).astype(np.uint16)
    bits[0, :, :5] = [0x0001, 0x83ff, 0x0400, 0x7bff, 0xfc00]   # subnormal, normal edges, -inf
    bits[1, :, :2] = [0x7c00, 0x7e01]                           # inf, nan
    wb = rng.integers(0x2c00, 0x4c00, (D, 1), dtype=np.uint32).astype(np.uint16)
    wb[:6, 0] = [0x0001, 0x3c01, 0x7bff, 0x8400, 0x3800, 0x1400]
    xn, wn = bits.view(np.float16), wb.view(np.float16)
    with np.errstate(all="ignore"):
        want = (xn.astype(np.float32) * wn[None, :, :1].astype(np.float32)).astype(np.float16)
    x, w = jnp.asarray(xn), jnp.asarray(wn)
    if cl:
        x, want = jnp.swapaxes(x, 1, 2), np.swapaxes(want, 1, 2)
    y = np.asarray(jcc.causal_conv1d(x, w, channels_last=cl, backend="ffi"))
    yr = np.asarray(reference.causal_conv1d(x, w, channels_last=cl))
    np.testing.assert_array_equal(y, want)  # (NaN where numpy has NaN)
    np.testing.assert_array_equal(y, yr)
    sub = np.abs(want.astype(np.float32)) < 2.0 ** -14
    assert np.isinf(y).sum() > 100 and np.isnan(y).sum() > 100 and (sub & (want != 0)).sum() > 100
