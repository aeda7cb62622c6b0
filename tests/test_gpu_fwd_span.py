"""The streaming forward walking several chunks a warp (on trial: it runs
only with JCC_EXPERIMENTAL_FWD_SPAN=2 or 4, which cuda/dispatch.cu reads at
each call). A warp walks a span only when enough warps remain (at least
32768), so the shapes here are large: rows x chunks >= 65536. With the
switch on, the outputs must equal the one-chunk kernels' bit for bit (the
same arithmetic per output) and the CPU kernels within the tolerance: dense
W 1..8 and the buckets 12 and 16, seq_idx at the buckets (W <= 8 takes the
shared-ids kernels, which do not walk), initial and final states, a
residual, spans whose last chunk is partial and rows whose last span is
short. Goes when the switch does (the default then walks, and test_gpu.py's
large cases cover it)."""

import numpy as np
import pytest

import jax.numpy as jnp

import jax_causal_conv as jcc

from gpu_support import GPU, MARKS, check, inputs, run

pytestmark = MARKS

# (dtype, B, D, L): bf16 chunks are 1024 steps (L = 2056: 2 full + 8 steps,
# spans of 2 chunks); float32 chunks 512 (L = 2060: 4 full + 12 steps, spans
# of 4 and a short last span of one partial chunk). D leaves a partial block.
SHAPES = [("bfloat16", 2, 16398, 2056), ("float32", 1, 32770, 2060)]


def ids_for(B, L):
    ids = np.zeros((B, L), np.int32)
    ids[:, 700:] = 1
    ids[:, 1023:1025] = [[2, 3]] * B        # one-step segments at the bf16 chunk edge
    ids[:, 1500:] = 4
    ids[:, 2040:] = -1                     # a padded tail
    return jnp.asarray(ids)


@pytest.mark.parametrize("dtype,B,D,L", SHAPES)
@pytest.mark.parametrize("W,mode", [(1, "dense"), (4, "dense"), (8, "dense"), (12, "dense"),
                                    (16, "dense"), (12, "seq"), (16, "seq")])
def test_walk_equals_one_chunk(monkeypatch, dtype, B, D, L, W, mode):
    if dtype == "bfloat16" and W > 12:
        pytest.skip("16-bit W > 12 takes the tensor-core forward")
    rng = np.random.default_rng(W)
    x, w, b, init = inputs(rng, B, D, L, W, dtype, False)
    res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    sidx = ids_for(B, L) if mode == "seq" else None

    def f(x, w, b, r, h):
        y1, s1 = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, initial_states=h,
                                   return_final_states=True, residual=r, backend="ffi")
        y2 = jcc.causal_conv1d(x, w, None, seq_idx=sidx, backend="ffi")  # no bias, activation, states
        return y1, s1, y2

    args = (x, w, b, res, init)
    monkeypatch.setenv("JCC_EXPERIMENTAL_FWD_SPAN", "1")
    one = run(GPU, f, *args)
    for span in ("2", "4"):
        monkeypatch.setenv("JCC_EXPERIMENTAL_FWD_SPAN", span)
        walk = run(GPU, f, *args)
        for i, (a, e) in enumerate(zip(walk, one)):
            assert np.array_equal(a, e, equal_nan=True), f"span {span}, output {i}"
    check(f, args, dtype, f"walk {dtype} W={W} {mode}")
