"""The streaming forward walking several chunks a warp (the default at
W >= 2; JCC_FWD_SPAN = 1, 2 or 4 overrides the most, read by cuda/dispatch.cu
at each call). A warp walks a span only when enough warps remain (at least
32768), so the shapes here are large: rows x chunks >= 65536. Walking 2 or 4 chunks (and
the default), the outputs must equal the one-chunk kernels' bit for bit (the
same arithmetic per output) and the CPU kernels within the tolerance: dense
widths from 1 to 16 (each compiled at its own width), initial and final
states, a residual, the hand-over into a partial last chunk, and short
last spans. seq_idx takes the shared-ids kernels, which do not walk: its
cases check them at these large shapes against the CPU."""

import numpy as np
import pytest

import jax.numpy as jnp

import jax_causal_conv as jcc

from gpu_support import MARKS, check, inputs, same_under_settings

pytestmark = MARKS

# (dtype, B, D, L, W, mode). bf16 chunks are 1024 steps: L = 1032 is one
# full chunk and 8 steps, a span of both (the hand-over into a partial
# chunk). float32 chunks are 512: L = 1548 is 3 full chunks and 12 steps
# (switch 4: one span of all four; 2: the second span hands over into the
# partial chunk); L = 2572 is 5 full chunks and 12 steps (4: a full span and
# a short one of a full and a partial chunk). D leaves a partial block.
# Widths: W 10, 11, 13 among them (the buckets of 12 and 16 taps before the
# eighteenth session).
CASES = [("bfloat16", 2, 16398, 1032, W, m) for W, m in ((1, "dense"), (3, "dense"), (8, "dense"),
                                                         (11, "dense"), (11, "seq"))] + \
        [("float32", 1, 32770, 1548, W, m) for W, m in ((2, "dense"), (7, "dense"), (13, "dense"),
                                                       (10, "dense"))] + \
        [("float32", 1, 32770, 2572, W, m) for W, m in ((4, "dense"), (16, "dense"), (16, "seq"))]


def ids_for(B, L):
    ids = np.zeros((B, L), np.int32)
    ids[:, 700:] = 1
    ids[:, 1023:1025] = [[2, 3]] * B        # one-step segments at the bf16 chunk edge
    ids[:, L - 40:] = 4
    ids[:, L - 9:] = -1                    # a padded tail
    return jnp.asarray(ids)


@pytest.mark.parametrize("dtype,B,D,L,W,mode", CASES)
def test_walk_equals_one_chunk(monkeypatch, dtype, B, D, L, W, mode):
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
    same_under_settings(monkeypatch, "JCC_FWD_SPAN", "1", ("2", "4", None), f, args)
    check(f, args, dtype, f"walk {dtype} L={L} W={W} {mode}")
