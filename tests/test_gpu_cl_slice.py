"""The channels-last row kernels' slice (the backward's: below). In the
forward each thread walks the width's base number of steps or twice
it (cuda/cl_row_plan.cu chooses
from the grid's size; JCC_CL_FWD_STEPS, a multiple of 8 up to the longest,
overrides it at each call). Every slice, and the plan's own choice, must
give the base slice's outputs bit for bit (the same arithmetic per output)
and the CPU kernels' within the tolerance: the slices of each base (W 3,
7, 8, 11, 16), dense, seq_idx
(padding, one-step segments, ids across slice edges) and varlen, with
initial and final states, a residual (not varlen), and a row whose last
slice is partial."""

import numpy as np
import pytest

import jax.numpy as jnp

import jax_causal_conv as jcc

from gpu_support import GPU, MARKS, check, grads, inputs, run, same_under_settings

pytestmark = MARKS

BASE = {1: 64, 2: 64, 3: 64, 4: 64, 7: 64, 8: 64, 11: 128, 16: 128}   # ClFwdSteps(W)

# (dtype, B, D, L, W, mode): L is no multiple of a block's steps (4 slices)
CASES = [("bfloat16", 2, 72, 1000, 3, "dense"), ("float32", 2, 40, 1000, 3, "seq"),
         ("bfloat16", 2, 40, 1100, 7, "seq"), ("float16", 1, 24, 1100, 8, "dense"),
         ("float32", 2, 12, 2100, 11, "seq"), ("bfloat16", 1, 16, 2100, 11, "dense"),
         ("bfloat16", 2, 20, 2100, 16, "seq"), ("float32", 1, 8, 2100, 16, "varlen"),
         ("bfloat16", 1, 24, 1100, 7, "varlen"), ("bfloat16", 2, 40, 1000, 4, "seq"),
         ("float16", 1, 24, 1000, 2, "dense"), ("float32", 2, 12, 1000, 4, "varlen"),
         ("bfloat16", 2, 48, 1000, 1, "seq"), ("float32", 1, 8, 1100, 1, "dense")]


def ids_for(rng, B, L):
    ids = np.sort(rng.integers(0, 9, (B, L)), axis=1).astype(np.int32)
    ids[:, 255:257] = [[20, 21]] * B      # one-step segments across a 256-step edge
    ids[:, L - 13:] = -1                  # a padded tail
    return jnp.asarray(ids)


def case_conv(rng, dtype, B, D, L, W, mode):
    """A case's x, w, b, initial states and its convolution `conv(x, w, b,
    **options)`: varlen over one (T, D) row of five sequences, else
    channels-last rows with seq_idx (mode "seq") or without."""
    x, w, b, init = inputs(rng, B, D, L, W, dtype, True)
    if mode == "varlen":
        lens = [5, 1, L // 2 - 6, 2, L - L // 2 - 2]
        cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
        init = jnp.asarray(rng.standard_normal((len(lens), D, W - 1)), x.dtype)

        def conv(x, w, b, **options):
            return jcc.causal_conv1d_varlen(x, w, b, cu_seqlens=cu, backend="ffi", **options)
        return x[0], w, b, init, conv
    sidx = ids_for(rng, B, L) if mode == "seq" else None

    def conv(x, w, b, **options):
        return jcc.causal_conv1d(x, w, b, seq_idx=sidx, channels_last=True, backend="ffi", **options)
    return x, w, b, init, conv


@pytest.mark.parametrize("dtype,B,D,L,W,mode", CASES)
def test_every_slice_equals_base(monkeypatch, dtype, B, D, L, W, mode):
    rng = np.random.default_rng(W + L)
    x, w, b, init, conv = case_conv(rng, dtype, B, D, L, W, mode)
    res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    residual = mode != "varlen"  # (varlen takes no residual)

    def f(x, w, b, r, h):
        y1, s1 = conv(x, w, b, activation="silu", initial_states=h, return_final_states=True,
                      **({"residual": r} if residual else {}))
        return y1, s1, conv(x, w, None)

    args = (x, w, b, res, init)
    base = BASE[W]
    same_under_settings(monkeypatch, "JCC_CL_FWD_STEPS", str(base),
                        (str(base // 2), str(2 * base), None), f, args)
    check(f, args, dtype, f"cl slice {dtype} L={L} W={W} {mode}")


# The backward: 128 steps a thread, or 256 (JCC_CL_BWD_STEPS; never fewer,
# the partial weight sums' workspace is sized for 512 steps a block). dx is
# the same arithmetic at either (bit for bit); dweight / dbias / the
# initial states' gradient sum their partials in another grouping, so they
# are checked against the CPU kernels.
BWD_CASES = [("bfloat16", 2, 40, 1100, 7, "seq"), ("float32", 2, 12, 2100, 11, "seq"),
             ("bfloat16", 1, 20, 2100, 16, "dense"), ("float32", 1, 8, 2100, 13, "varlen")]


@pytest.mark.parametrize("dtype,B,D,L,W,mode", BWD_CASES)
def test_backward_slices(monkeypatch, dtype, B, D, L, W, mode):
    rng = np.random.default_rng(W + L + 1)
    x, w, b, init, conv = case_conv(rng, dtype, B, D, L, W, mode)

    def f(x, w, b, h):
        return conv(x, w, b, activation="silu", initial_states=h, return_final_states=True)

    g = grads(f, (0, 1, 2, 3))
    args = (x, w, b, init)
    monkeypatch.setenv("JCC_CL_BWD_STEPS", "128")
    want = run(GPU, lambda *a: g(*a), *args)
    monkeypatch.setenv("JCC_CL_BWD_STEPS", "256")
    got = run(GPU, lambda *a: g(*a), *args)
    assert np.array_equal(got[1][0], want[1][0], equal_nan=True), "dx"
    check(g, args, dtype, f"cl backward slice 256 {dtype} L={L} W={W} {mode}")
