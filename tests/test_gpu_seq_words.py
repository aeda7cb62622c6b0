"""The channels-first seq_idx forward and backward as the dense streaming
kernels reading each row's mask words, made once by a pre-pass
(cuda/seq_words.cuh's SeqWordsKernel, FwdStreamKernel<.., kSeq> and
BwdStreamKernel<.., kSeq>; forced at W 1..16 with JCC_SEQ_WORDS_FWD=1 and
JCC_SEQ_WORDS=1, and as dispatch.cu's SeqWordsForward / SeqWordsBackward
take them for long rows by default), against the CPU kernels: packed rows
with one-step segments across the chunk edges, padding in the middle and a
padded tail, an id that returns (test_gpu_seq_idx_stream.py's ids), initial
and final states (the row's first sequence owns the initial ones), a
residual, no activation, vmapped weights, rows long enough that a warp
walks two chunks (the g after a chunk handed over across an id change; the
forward's vector before a chunk), and rows that begin with padding or a
one-step sequence (the pre-pass's id before a row)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_causal_conv as jcc

from gpu_support import DRY_RUN, GPU, MARKS, check, grads, inputs
from helpers import forward_v1
from test_gpu_seq_idx_stream import packed_ids

pytestmark = MARKS

SHAPES = [(2, 20, 2056), (1, 33, 1104), (3, 16, 520)]


def force_words(monkeypatch, fwd="1", bwd="1"):
    for var, v in (("JCC_SEQ_WORDS_FWD", fwd), ("JCC_SEQ_WORDS", bwd)):
        if v is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, v)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("W", [*range(1, 9), 9, 12, 16])
def test_seq_words(monkeypatch, dtype, W):
    force_words(monkeypatch)
    rng = np.random.default_rng(100 + W)
    for (B, D, L) in SHAPES:
        x, w, b, init = inputs(rng, B, D, L, W, dtype, False)
        res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
        sidx = packed_ids(rng, B, L)

        def f(x, w, b, r, h):
            y1, s1 = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, initial_states=h,
                                       return_final_states=True, residual=r, backend="ffi")
            y2 = jcc.causal_conv1d(x, w, b, seq_idx=sidx, backend="ffi")  # no activation, no states
            return y1, s1, y2

        check(grads(f, (0, 1, 2, 3, 4)), (x, w, b, res, init), dtype, f"seq words {B, D, L} W={W}")
    wv = jnp.stack([w, w[:, ::-1]])  # a vmapped weight: groups = 2
    fv = jax.vmap(lambda x, w: jcc.causal_conv1d(x[None], w, b, activation="silu", seq_idx=sidx[:1],
                                                 backend="ffi")[0])
    check(grads(fv, (0, 1)), (x[:2], wv), dtype, "seq words groups")


def row_start_ids(L):
    # how rows begin: the pre-pass gives the positions before a row its first
    # id (SeqWordsKernel, by sequences.cuh's RowFirstId), so these rows'
    # first warp steps are plain or masked by what follows, with or without
    # states
    ids = np.zeros((5, L), np.int32)
    ids[0, :5], ids[0, 5:] = -1, 1                  # padding first
    ids[1, 0], ids[1, 1:] = 7, 8                    # a one-step first sequence
    ids[2, :40], ids[2, 40:100], ids[2, 100:110], ids[2, 110:] = 3, 4, 3, 5  # the first id returns
    ids[3, :] = 2                                   # one sequence
    ids[4, :3], ids[4, 3:] = -1, 6                  # padding shorter than the taps
    ids[:, -7:] = -1
    return jnp.asarray(ids)


@pytest.mark.parametrize("dtype,W", [("bfloat16", 4), ("bfloat16", 12), ("float32", 4), ("float32", 12)])
def test_seq_words_row_starts(monkeypatch, dtype, W):
    force_words(monkeypatch)
    rng = np.random.default_rng(200 + W)
    B, D, L = 5, 24, 2056
    x, w, b, init = inputs(rng, B, D, L, W, dtype, False)
    sidx = row_start_ids(L)

    def f(x, w, b, h):
        y1, s1 = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, initial_states=h,
                                   return_final_states=True, backend="ffi")
        y2 = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, backend="ffi")
        return y1, s1, y2

    check(grads(f, (0, 1, 2, 3)), (x, w, b, init), dtype, f"seq words row starts W={W}")


@pytest.mark.parametrize("dtype,W", [("bfloat16", 4), ("bfloat16", 8), ("float32", 5)])
def test_seq_words_spans(monkeypatch, dtype, W):
    # 8 x 4096 rows of 2 or 3 chunks: the plan gives a warp spans of 2
    # chunks (cuda/forward_stream.cu's StreamSpans), so an id change or the
    # padding can fall on the chunk a warp hands its g over from (the
    # backward) or takes its vector before the chunk from (the forward)
    force_words(monkeypatch)
    rng = np.random.default_rng(W)
    B, D, L = 8, 4096, 2056 if dtype == "bfloat16" else 1032
    x, w, b, _ = inputs(rng, B, D, L, W, dtype, False)
    ids = np.zeros((B, L), np.int32)
    edge = 1024 if dtype == "bfloat16" else 512  # the first chunk's end
    ids[:, edge - 2:] = 1
    ids[:, edge + 3:] = 2
    ids[1::2, edge - 40: edge + 40] = -1
    ids[:, -9:] = -1
    sidx = jnp.asarray(ids)
    f = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, backend="ffi")  # noqa: E731
    check(grads(f, (0, 1, 2)), (x, w, b), dtype, f"seq words spans W={W}")


@pytest.mark.parametrize("dtype,shape,W", [("bfloat16", (2, 8192, 4096), 6), ("float32", (1, 16384, 4096), 8)])
def test_seq_words_default_rule(monkeypatch, dtype, shape, W):
    # 2^26 elements in rows of 4096 steps: the plan's own choice (no
    # JCC_SEQ_WORDS*) takes the words here (the forward's: 16-bit only)
    force_words(monkeypatch, None, None)
    rng = np.random.default_rng(7 + W)
    B, D, L = shape
    x, w, b, _ = inputs(rng, B, D, L, W, dtype, False)
    sidx = packed_ids(rng, B, L)
    f = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, backend="ffi")  # noqa: E731
    check(grads(f, (0, 1, 2)), (x, w, b), dtype, f"seq words default {shape} W={W}")


# (dtype a parameter, so that conftest.py skips it on a build without it)
@pytest.mark.parametrize("dtype,W", [("bfloat16", 4), ("float32", 12)])
def test_forward_v1_target_takes_the_shared_ids(monkeypatch, dtype, W):
    # jax_causal_conv_fwd_v1 has no workspace: its seq_idx calls take the
    # shared-ids kernel, and compute what v2 reading the words does
    force_words(monkeypatch)
    rng = np.random.default_rng(3 + W)
    B, D, L = 2, 24, 2056
    x, w, b, init = inputs(rng, B, D, L, W, dtype, False)
    sidx = packed_ids(rng, B, L)
    x, w, b, init, sidx = jax.device_put((x, w, b, init, sidx), GPU)
    y = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, initial_states=init, backend="ffi")
    y1 = forward_v1(x, w, b, sidx, init)
    tol = 1e-5 if dtype == "float32" else 1e-2
    np.testing.assert_allclose(np.asarray(y1, np.float32), np.asarray(y, np.float32), rtol=tol, atol=tol)


# The plan's choice itself, read from the kernels a forward or a backward
# launches (the JAX profiler's trace, as
# benchmarks/probes/kernel_list_probe.py): the words where dispatch.cu's
# SeqWordsForward / SeqWordsBackward take them, the shared-ids kernel
# elsewhere and when JCC_SEQ_WORDS_FWD=0 / JCC_SEQ_WORDS=0 forces it. (The
# backward's cases force the forward's words off, so that the pre-pass seen
# is the backward's.) The last two columns: the backward's words, the
# forward's (16-bit x at W >= 6 only).
PLAN_CASES = [
    (None, (2, 8192, 4096), "bfloat16", 6, True, True),     # long rows, 2^26 elements
    ("0", (2, 8192, 4096), "bfloat16", 6, False, False),    # forced off
    ("1", (2, 8192, 2048), "bfloat16", 4, True, True),      # forced on
    (None, (4, 8192, 2048), "bfloat16", 6, False, False),   # 2^26 elements in rows shorter than 4096 steps
    (None, (1, 8192, 4096), "bfloat16", 6, False, False),   # 2^25 elements
    (None, (2, 8192, 4096), "bfloat16", 4, True, False),    # the forward's from W 6
    (None, (1, 16384, 4096), "float32", 4, True, False),    # the backward's at every dtype
    (None, (4, 8192, 2048), "float32", 8, False, False),    # float32 rows shorter than 4096 steps
    (None, (2, 8192, 4096), "bfloat16", 12, True, True),    # W 9..16 as W 2..8
    (None, (1, 16384, 4096), "float32", 12, True, False),
]


@pytest.mark.skipif(DRY_RUN, reason="kernel names need a GPU trace")
@pytest.mark.parametrize("env,shape,dtype,W,bwd_words,fwd_words", PLAN_CASES)
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_seq_words_plan(monkeypatch, pass_, env, shape, dtype, W, bwd_words, fwd_words):
    from benchmarks.timing import device_events
    if pass_ == "fwd":
        force_words(monkeypatch, env, None)
    else:
        force_words(monkeypatch, "0", env)
    rng = np.random.default_rng(W)
    B, D, L = shape
    x, w, b, _ = inputs(rng, B, D, L, W, dtype, False)
    sidx = packed_ids(rng, B, L)
    x, w, b, sidx = jax.device_put((x, w, b, sidx), GPU)
    conv = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx,  # noqa: E731
                                             backend="ffi")

    def step(x, w, b):  # (a new function each call: no program reused across settings)
        if pass_ == "fwd":
            return conv(x, w, b)
        y, vjp = jax.vjp(conv, x, w, b)
        return y, vjp(jnp.ones_like(y))

    words = fwd_words if pass_ == "fwd" else bwd_words
    names = {name for name, _, _ in device_events(jax.jit(step), x, w, b, n=1)}
    ids, dense = ("FwdStreamIdsKernel", "FwdStreamKernel") if pass_ == "fwd" else \
        ("BwdStreamIdsKernel", "BwdStreamKernel")
    assert any(ids in n or dense in n for n in names), sorted(names)
    assert any("SeqWordsKernel" in n for n in names) == words, sorted(names)
    assert any(ids in n for n in names) == (not words), sorted(names)
