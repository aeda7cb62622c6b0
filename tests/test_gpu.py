"""CUDA kernels against the CPU kernels and the jnp reference.

Skipped unless a GPU is visible and the CUDA module was built. Every check
runs the same jitted function on the GPU and on the CPU (our C++ kernel) and
compares, per dtype; names containing "small" form the reduced grid that the
compute-sanitizer runs use.
"""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_causal_conv as jcc

from gpu_support import CPU, DRY_RUN, DT, GPU, MARKS, REL, check, grads, inputs, run
from helpers import package_env

pytestmark = MARKS

WIDTHS = [1, 2, 3, 4, 5, 8, 33]


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("W", WIDTHS)
@pytest.mark.parametrize("cl", [False, True])
def test_small_forward_backward(dtype, W, cl):
    rng = np.random.default_rng(W * 7 + cl)
    # (2,12,520) and (1,3,4104): rows of whole 16-byte vectors, one partial
    # tile and several tiles, for the streaming kernels (forward_stream.cu).
    for (B, D, L) in [(2, 40, 67), (3, 16, 2), (2, 12, 520), (1, 3, 4104)]:
        x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
        res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
        for act in (None, "silu"):
            f = lambda x, w, b, r: jcc.causal_conv1d(x, w, b, activation=act, residual=r,
                                                     channels_last=cl, backend="ffi")
            check(grads(f, (0, 1, 2, 3)), (x, w, b, res), dtype, f"plain {act} {B,D,L}")
            if W > 1:
                f2 = lambda x, w, b, s: jcc.causal_conv1d(
                    x, w, b, activation=act, initial_states=s, return_final_states=True,
                    channels_last=cl, backend="ffi")
                check(grads(f2, (0, 1, 2, 3)), (x, w, b, init), dtype, f"states {act} {B,D,L}")
        # no bias
        f3 = lambda x, w: jcc.causal_conv1d(x, w, channels_last=cl, backend="ffi")
        check(grads(f3, (0, 1)), (x, w), dtype, "nobias")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [2, 4, 5, 33])
@pytest.mark.parametrize("cl", [False, True])
def test_small_seq_idx(dtype, W, cl):
    rng = np.random.default_rng(W + 100 * cl)
    B, D, L = 2, 24, 1100
    x, w, b, _ = inputs(rng, B, D, L, W, dtype, cl)
    sidx = jnp.asarray(np.sort(rng.integers(0, 9, (B, L)), axis=1), jnp.int32)
    f = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx,
                                          return_final_states=W > 1, channels_last=cl, backend="ffi")
    check(grads(f, (0, 1, 2)), (x, w, b), dtype, "seq_idx")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [1, 3, 4, 8, 9, 13, 16, 20])
@pytest.mark.parametrize("D", [20, 32])
def test_small_varlen(dtype, W, D):
    """D = 32: whole channel vectors (the channels-last row family for
    W <= 16, each W at its own width); D = 20 the tile family
    where a vector does not divide it."""
    rng = np.random.default_rng(W)
    lens = [5, 0, 1, 300, 2, 1200, 3]
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lens)]), jnp.int32)
    T = int(cu[-1])
    x = jnp.asarray(rng.standard_normal((T, D)), DT[dtype])
    w = jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), DT[dtype])
    b = jnp.asarray(rng.standard_normal((D,)), DT[dtype])
    init = jnp.asarray(rng.standard_normal((len(lens), D, W - 1)), DT[dtype])
    f = lambda x, w, b, s: jcc.causal_conv1d_varlen(
        x, w, b, cu_seqlens=cu, activation="silu", initial_states=s if W > 1 else None,
        return_final_states=W > 1, backend="ffi")
    check(grads(f, (0, 1, 2, 3) if W > 1 else (0, 1, 2)), (x, w, b, init), dtype, "varlen")
    fs = lambda x: jcc.causal_conv1d_varlen_states(x, cu, 5, backend="ffi")
    check(fs, (x,), dtype, "varlen_states")


EVERY_WIDTH = list(range(1, 18)) + [32, 64, 128, 256]  # (each W <= 16 compiled at its own width)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", EVERY_WIDTH)
@pytest.mark.parametrize("cl", [False, True])
def test_small_every_width_and_mode(dtype, W, cl):
    """Every width, in one jitted function per shape: plain (residual, SiLU),
    initial + final states, and seq_idx with padding, unordered ids and
    initial states; forward and every gradient, GPU against the CPU kernels.
    (2, 64, 520): whole aligned vectors (the hot families for W <= 4);
    (2, 40, 301): rows that are not (the tile family); (1, 33, 1100):
    several time tiles and a partial channel group."""
    rng = np.random.default_rng(W * 3 + cl)
    for (B, D, L) in [(2, 64, 520), (2, 40, 301), (1, 33, 1100)]:
        x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
        res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
        ids = np.sort(rng.integers(0, 6, (B, L)), axis=1)
        ids[:, L // 3: L // 3 + 7] = -1            # padding in the middle
        ids[:, -11:] = -1                          # and at the tail
        ids[:, L // 2: L // 2 + 5] = 9             # an id that appears again later
        ids[:, L // 2 + 30: L // 2 + 33] = 9
        sidx = jnp.asarray(ids, jnp.int32)

        def f(x, w, b, r, h):
            y1 = jcc.causal_conv1d(x, w, b, activation="silu", residual=r, channels_last=cl,
                                   backend="ffi")
            outs = [y1]
            if W > 1:
                outs += list(jcc.causal_conv1d(x, w, b, initial_states=h, return_final_states=True,
                                               channels_last=cl, backend="ffi"))
                outs += list(jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx,
                                               initial_states=h, return_final_states=True,
                                               residual=r, channels_last=cl, backend="ffi"))
            else:
                outs.append(jcc.causal_conv1d(x, w, b, seq_idx=sidx, channels_last=cl, backend="ffi"))
            return tuple(outs)

        check(grads(f, (0, 1, 2, 3, 4) if W > 1 else (0, 1, 2, 3)), (x, w, b, res, init), dtype,
              f"widths {B,D,L}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [17, 24, 33, 64, 200])
@pytest.mark.parametrize("cl", [False, True])
def test_small_wide_family_spans(dtype, W, cl):
    """The wide families (channels-first whole-vector rows, channels-last
    whole groups of 8 channels; W > 16): rows of
    several warp spans (4096 steps) and a partial last chunk; seq_idx with
    segments that end inside and across spans and chunks, a run of
    one-token segments, padding in the middle and at the tail, and an id
    that returns; a vmapped weight (groups); forward and gradients, GPU
    against the CPU kernels."""
    rng = np.random.default_rng(W + cl)
    B, D, L = 2, 16 if cl else 6, 9000
    x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
    res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    ids = np.zeros((B, L), np.int32)
    for r in range(B):
        cuts = np.sort(rng.choice(np.arange(1, L), 9, replace=False))
        ids[r] = np.searchsorted(cuts, np.arange(L), side="right")
    ids[0, 4090:4100] = np.arange(100, 110)  # one-token segments across a span edge
    ids[0, 1500:1530] = -1                   # padding in the middle
    ids[1, 6000:6040] = ids[1, 100]          # an id that returns
    ids[:, -37:] = -1                        # and a padded tail
    sidx = jnp.asarray(ids)

    conv = functools.partial(jcc.causal_conv1d, channels_last=cl, backend="ffi")

    def f(x, w, b, r, h):
        y1 = conv(x, w, b, activation="silu", residual=r)
        y2, s2 = conv(x, w, b, initial_states=h, return_final_states=True)
        y3, s3 = conv(x, w, b, activation="silu", seq_idx=sidx, initial_states=h,
                      return_final_states=True, residual=r)
        y4 = conv(x, w, b, seq_idx=sidx)  # no activation, no states
        return y1, y2, s2, y3, s3, y4

    check(grads(f, (0, 1, 2, 3, 4)), (x, w, b, res, init), dtype, "wide spans")
    wv = jnp.stack([w, w[:, ::-1]])  # a vmapped weight: groups = 2
    fv = jax.vmap(lambda x, w: conv(x[None], w, b, activation="silu", seq_idx=sidx[:1])[0])
    check(grads(fv, (0, 1)), (x, wv), dtype, "wide groups")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [17, 24, 64])
@pytest.mark.parametrize("cl", [False, True])
def test_small_wide_rows_of_one_sequence(dtype, W, cl):
    """The wide families' seq_idx chunks at a row's ends without padding:
    rows of one sequence, a last sequence that runs to the row's end, an id
    change inside the first chunk's window, a last sequence of 3 steps;
    without and with initial states, and a partial last chunk (4104
    steps: chunks of 512). Forward and gradients, GPU against the CPU
    kernels."""
    rng = np.random.default_rng(W + 11 * cl)
    B, D, L = 4, 16 if cl else 6, 4104
    x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
    ids = np.zeros((B, L), np.int32)
    ids[1, 3000:] = 1
    ids[2, :5], ids[2, 5:] = 7, 8
    ids[3, -3:] = 1
    sidx = jnp.asarray(ids)
    conv = functools.partial(jcc.causal_conv1d, activation="silu", seq_idx=sidx, channels_last=cl,
                             backend="ffi")

    def f(x, w, b, h):
        y1 = conv(x, w, b)
        y2, s2 = conv(x, w, b, initial_states=h, return_final_states=True)
        return y1, y2, s2

    check(grads(f, (0, 1, 2, 3)), (x, w, b, init), dtype, "wide rows of one sequence")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [4, 17, 40])
@pytest.mark.parametrize("cl", [False, True])
def test_small_seq_idx_nonfinite_padding(dtype, W, cl):
    """Inf and NaN inputs in padding (leading, in the middle over a span
    edge, at the tail) reach no output and no gradient: forward and
    gradients finite and as the CPU kernels'. The middle padding's id is
    INT32_MIN, the value the kernels use for "no id" (a run of padding
    outputs once summed its window's inputs of that id into the dweight)."""
    rng = np.random.default_rng(W + 3 * cl)
    B, D, L = 2, 16, 5000
    x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
    ids = np.broadcast_to(np.arange(L) // 700, (B, L)).astype(np.int32)
    ids[:, 4000:4200] = np.iinfo(np.int32).min
    ids[:, -45:] = -1
    ids[1, :30] = -1
    pad = (ids < 0)[:, :, None] if cl else (ids < 0)[:, None, :]
    odd = (np.arange(x.size).reshape(x.shape) % 2).astype(bool)
    x = jnp.asarray(np.where(np.broadcast_to(pad, x.shape), np.where(odd, np.inf, np.nan),
                             np.asarray(x, np.float32)), x.dtype)
    sidx = jnp.asarray(ids)
    f = lambda x, w, b, h: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, initial_states=h,
                                             return_final_states=True, channels_last=cl, backend="ffi")
    check(grads(f, (0, 1, 2, 3)), (x, w, b, init), dtype, "non-finite padding")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [2, 4, 5, 8, 17])
@pytest.mark.parametrize("cl", [False, True])
def test_small_packed_edge_table(dtype, W, cl):
    """The seq_idx edge cases of tests/test_packed.py (padding in the middle
    and at the tail, ids not increasing or returning, one-token segments,
    all-padding rows), one row each, as they are and stretched 40 times."""
    from test_packed import EDGE_ROWS
    table = np.stack([np.asarray(EDGE_ROWS[k], np.int32) for k in sorted(EDGE_ROWS)])
    rng = np.random.default_rng(W + 7 * cl)
    for ids in (table, np.repeat(table, 40, axis=1)):
        B, L = ids.shape
        x, w, b, init = inputs(rng, B, 20, L, W, dtype, cl)
        res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
        sidx = jnp.asarray(ids)
        f = lambda x, w, b, r, h: jcc.causal_conv1d(
            x, w, b, activation="silu", seq_idx=sidx, initial_states=h, return_final_states=True,
            residual=r, channels_last=cl, backend="ffi")
        check(grads(f, (0, 1, 2, 3, 4)), (x, w, b, res, init), dtype, f"packed {L}")


@pytest.mark.parametrize("cl", [False, True])
def test_small_mixed_weight_dtypes(cl):
    rng = np.random.default_rng(5)
    x, _, _, _ = inputs(rng, 2, 32, 96, 4, "bfloat16", cl)
    w = jnp.asarray(rng.standard_normal((32, 4)), jnp.float64)
    b = jnp.asarray(rng.standard_normal((32,)), jnp.float16)
    f = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", channels_last=cl, backend="ffi")
    check(grads(f, (0, 1, 2)), (x, w, b), "bfloat16", "mixed")


@pytest.mark.parametrize("cl", [False, True])
def test_vmap_weight_groups(cl):
    rng = np.random.default_rng(9)
    x, w, b, _ = inputs(rng, 6, 64, 512, 4, "float32", cl)
    ws = jnp.stack([w, 2 * w, -w])
    xs = x.reshape((3, 2) + x.shape[1:])
    f = lambda xs, ws: jax.vmap(lambda x, w: jcc.causal_conv1d(x, w, b, channels_last=cl, backend="ffi"))(xs, ws)
    check(grads(f, (0, 1)), (xs, ws), "float32", "vmap groups")


@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("shape", [(4, 512, 4096), (2, 96, 20000)])
def test_large_vs_cpu_and_deterministic(cl, shape):
    rng = np.random.default_rng(1)
    B, D, L = shape
    x, w, b, _ = inputs(rng, B, D, L, 4, "bfloat16", cl)
    f = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", channels_last=cl, backend="ffi")
    g = grads(f, (0, 1, 2))
    check(g, (x, w, b), "bfloat16", "large")
    args = jax.device_put((x, w, b), GPU)
    jg = jax.jit(g)
    r1 = jax.tree.map(np.asarray, jg(*args))
    r2 = jax.tree.map(np.asarray, jg(*args))
    for a1, a2 in zip(jax.tree.leaves(r1), jax.tree.leaves(r2)):
        assert np.array_equal(a1.view(np.uint16), a2.view(np.uint16)), "backward not bitwise reproducible"


# Enough rows that the channels-first backward gives each warp a span of
# several chunks (backward_stream.cu): (8, 4096, 2056) bf16 two chunks a span,
# the last span one partial chunk; (8, 4096, 3080) four chunks a span, the
# last partial. Halos of one vector (bf16 W 4), two (bf16 W 16) and four
# (float32 W 16: chunks of 512 steps, spans of four, the last span one
# chunk of 8 steps, so the vector after the span before it is partly past
# the end).
@pytest.mark.parametrize("dtype,W,shape", [("bfloat16", 4, (8, 4096, 2056)), ("bfloat16", 4, (8, 4096, 3080)),
                                           ("bfloat16", 16, (8, 4096, 3080)), ("float32", 16, (8, 4096, 2056))])
def test_large_backward_spans(dtype, W, shape):
    rng = np.random.default_rng(2)
    x, w, b, init = inputs(rng, *shape, W, dtype, False)
    for act in (None, "silu"):
        f = lambda x, w, b, s: jcc.causal_conv1d(x, w, b, activation=act, initial_states=s,
                                                 return_final_states=True, backend="ffi")
        check(grads(f, (0, 1, 2, 3)), (x, w, b, init), dtype, f"spans {act}")


def test_small_reference_agrees():
    rng = np.random.default_rng(3)
    x, w, b, init = inputs(rng, 2, 24, 77, 4, "float32", False)
    f = lambda x, w, b, s: jcc.causal_conv1d(x, w, b, activation="silu", initial_states=s,
                                             return_final_states=True, backend="ffi")
    r = lambda x, w, b, s: jcc.reference.causal_conv1d(x, w, b, activation="silu", initial_states=s,
                                                       return_final_states=True)
    got, want = run(GPU, f, x, w, b, init), run(CPU, r, x, w, b, init)
    for g, w_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w_, rtol=1e-4, atol=1e-4)


def test_small_empty():
    x = jnp.zeros((2, 8, 0), jnp.float32)
    w = jnp.ones((8, 4), jnp.float32)
    init = jnp.ones((2, 8, 3), jnp.float32)
    f = lambda x, w, s: jcc.causal_conv1d(x, w, initial_states=s, return_final_states=True, backend="ffi")
    check(grads(f, (0, 1, 2)), (x, w, init), "float32", "empty")


CMD_BUFFER_CHILD = """
import jax, jax.numpy as jnp, numpy as np
import jax_causal_conv as jcc
from jax_causal_conv._lowering import targets as _ffi

gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((2, 64, 1000)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((64, 4)), jnp.float32)
b = jnp.asarray(rng.standard_normal((64,)), jnp.float32)
h = jnp.asarray(rng.standard_normal((2, 64, 3)), jnp.bfloat16)
st = jnp.asarray(rng.standard_normal((2, 64, 3)), jnp.bfloat16)
tok = jnp.asarray(rng.standard_normal((2, 64)), jnp.bfloat16)
cu = jnp.asarray([0, 300, 1000], jnp.int32)

def model(x, w, b, h, st, tok):
    def loss(x, w, b, h):
        y, f = jcc.causal_conv1d(x, w, b, activation="silu", initial_states=h, return_final_states=True)
        return jnp.sum(y.astype(jnp.float32) ** 2) + jnp.sum(f.astype(jnp.float32))
    val, grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(x, w, b, h)
    y1, st1 = jcc.causal_conv1d_update(tok, st, w, b, activation="silu")
    y2, st2 = jcc.causal_conv1d_update(y1, st1, w, b, activation="silu")
    vs = jcc.causal_conv1d_varlen_states(jnp.swapaxes(x[0], 0, 1), cu, 3)
    return val, grads, y2, st2, vs

f = jax.jit(model)
args = (x, w, b, h, st, tok)
dev_args = jax.device_put(args, gpu)
counts = []
for _ in range(4):  # the same buffers each time: command buffers replay
    c0 = _ffi._jcc_cuda.handler_calls()
    out = jax.block_until_ready(f(*dev_args))
    counts.append(_ffi._jcc_cuda.handler_calls() - c0)
got = jax.tree.map(np.asarray, out)
got2 = jax.tree.map(np.asarray, f(*dev_args))
print("handler executions per run:", counts)
want = jax.tree.map(np.asarray, f(*jax.device_put(args, cpu)))
for g, g2, e in zip(jax.tree.leaves(got), jax.tree.leaves(got2), jax.tree.leaves(want)):
    g, g2, e = (np.asarray(a, np.float32) for a in (g, g2, e))
    assert np.array_equal(g, g2), "replay differs"
    assert np.allclose(g, e, rtol=3e-2, atol=3e-2 * (1 + np.abs(e).max())), float(np.abs(g - e).max())
print("CMD BUFFER OK", counts[0] - counts[-1])
"""


@pytest.mark.skipif(DRY_RUN, reason="XLA:GPU behaviour (a dry run on the CPU)")
def test_small_command_buffers(tmp_path):
    """Every handler declares itself command-buffer compatible: run a model
    using all four targets with XLA capturing custom calls into command
    buffers (CUDA graphs), replay it, and compare with the CPU kernels."""
    import subprocess
    import sys
    script = tmp_path / "child.py"
    script.write_text(CMD_BUFFER_CHILD)
    env = package_env(XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                                "--xla_gpu_graph_min_graph_size=1")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "CMD BUFFER OK" in r.stdout, r.stdout
    # replays run the recorded kernels without calling our handlers
    saved = int(r.stdout.split("CMD BUFFER OK")[1].split()[0])
    assert saved > 0, "none of our custom calls was replayed from a command buffer: " + r.stdout


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W, cl", [(4, False), (4, True), (16, False), (16, True)])
def test_subnormal_weights_like_the_reference(dtype, W, cl):
    """float32 weights below float32's normal range (1e-39) times large
    inputs and an Inf input: the products count as in float64 arithmetic (a
    numpy oracle), not flushed to zero (where 0 * Inf would give NaN). The
    CPU kernels are no oracle here: XLA:CPU and they flush subnormals."""
    if DRY_RUN:
        pytest.skip("on the CPU, XLA and our kernels flush subnormals: this oracle is for GPUs")
    B, D, L = 2, 16, 512
    x = np.full((B, D, L), 1e30, np.float32)
    x[:, :, 200] = np.inf
    w = np.full((D, W), 1e-39, np.float32)
    w[:, ::2] = 3e-39
    xd = np.asarray(jnp.asarray(x, DT[dtype]).astype(jnp.float32), np.float64)  # x as the kernel sees it
    want = np.zeros((B, D, L))
    for k in range(W):  # y[t] = sum_k w[k] x[t - (W - 1) + k]
        s = W - 1 - k
        want[:, :, s:] += w[:, k].astype(np.float64)[None, :, None] * xd[:, :, :L - s]
    xa = jnp.asarray(np.swapaxes(x, 1, 2) if cl else x, DT[dtype])
    f = lambda x, w: jcc.causal_conv1d(x, w, channels_last=cl, backend="ffi")  # noqa: E731
    got = run(GPU, f, xa, jnp.asarray(w))
    got = np.swapaxes(got, 1, 2) if cl else got
    assert np.array_equal(np.isinf(got), np.isinf(want)) and not np.isnan(got).any()
    fin = np.isfinite(want)
    assert np.allclose(got[fin], want[fin], rtol=REL[dtype], atol=0)
