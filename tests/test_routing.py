"""backend="auto" takes XLA's shifted sum in the cells where our kernel
measured slower (routing.py: on a GPU W = 1, channels-first rows past 16
that are not the wide family's, a small channels-first dense forward alone
at W <= 4 without states, and a channels-first seq_idx forward alone
at W <= 4 on too few blocks or at W = 2 in float32, and a channels-last
dense forward alone at W = 2 in float32 without states; on the CPU a forward that nothing
differentiates at W <= 2 without states (x up to 16 MiB), the whole op at W = 1
channels-first in float32 / float64, and small channels-first problems at
W <= 2 (the whole op) and W 3..4 (the seq_idx forward alone)); "ffi" still
insists on the kernel, and every other cell takes the kernel."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_causal_conv as jcc
from jax_causal_conv._lowering import routing, targets
from jax_causal_conv._lowering.config import ROWS, SEQ_IDX, VARLEN, ConvConfig
from jax_causal_conv._lowering.routing import _seq_idx_forward_blocks, cpu_kernel_wins, gpu_kernel_wins

from gpu_support import DRY_RUN, GPU, MARKS


@pytest.fixture
def no_small_rule(monkeypatch):
    """The CPU's small-problem rule off (its thresholds 0), so that the tests
    of the other rules can use small arrays. (JAX's caches are cleared on
    both sides: a traced call keeps the routing it was traced with.)"""
    _set_small_bounds(monkeypatch, 0)
    yield
    jax.clear_caches()


def _set_small_bounds(monkeypatch, bound):
    for k in routing.CPU_XLA_MAX_ELEMENTS:
        monkeypatch.setitem(routing.CPU_XLA_MAX_ELEMENTS, k, bound)
    for dt, widths in routing.CPU_XLA_SEQ_IDX_FORWARD.items():  # (each width's bound now `bound`)
        monkeypatch.setitem(routing.CPU_XLA_SEQ_IDX_FORWARD, dt, {bound: max(widths.values())})
    jax.clear_caches()


def _set_forward_bound(monkeypatch, nbytes):
    monkeypatch.setattr(routing, "CPU_XLA_FORWARD_MAX_BYTES", nbytes)
    jax.clear_caches()


def cpu_cfg(mode, cl, final=False, differentiated=False):
    """The config of the CPU table tests (no activation)."""
    return ConvConfig(activation=None, mode=mode, channels_last=cl, states_channels_last=cl,
                      want_final=final, backend="auto", differentiated=differentiated)


def cfg(mode, cl):
    return ConvConfig(activation="silu", mode=mode, channels_last=cl, states_channels_last=cl,
                      want_final=False, backend="auto")


def test_the_table():
    # every boundary of each rule, both sides; rows of whole 16-byte vectors
    # (bf16: L % 8 == 0) unless said
    wins = lambda c, W, L=4096, size=2: gpu_kernel_wins(c, W, L, size)  # noqa: E731
    assert [wins(cfg(SEQ_IDX, False), W) for W in (1, 2, 4, 16, 17, 32, 33, 256)] == \
        [False, True, True, True, True, True, True, True]
    assert [wins(cfg(ROWS, False), W) for W in (1, 2, 16, 17, 32, 64)] == \
        [False, True, True, True, True, True]
    # channels-first rows that are not whole vectors, or varlen: the tile family, XLA past 16
    assert [wins(cfg(ROWS, False), W, 4100) for W in (2, 16, 17, 64)] == [True, True, False, False]
    assert [wins(cfg(ROWS, False), W, 4098, 4) for W in (16, 17)] == [True, False]
    assert [wins(cfg(ROWS, False), 17, L, 4) for L in (4096, 4100)] == [True, True]
    assert [wins(cfg(VARLEN, False), W) for W in (8, 16, 17)] == [True, True, False]
    assert [wins(cfg(SEQ_IDX, True), W) for W in (1, 2, 16, 17, 32)] == \
        [False, True, True, True, True]
    assert [wins(cfg(VARLEN, True), W, 4100) for W in (17, 64)] == [True, True]
    assert not wins(cfg(SEQ_IDX, False), 1) and not wins(cfg(ROWS, True), 1)


def test_the_small_seq_idx_forward():
    # channels-first seq_idx at W <= 4, a forward nothing differentiates:
    # XLA below 1024 blocks of the shared-ids forward (batch x ceil(dim / 32)
    # x chunks of 1024 steps, 512 in float32); the kernel elsewhere
    def wins(c, W, B, D, L, size=2, backward=False):
        return gpu_kernel_wins(c, W, L, size, B, D, backward)
    sq = cfg(SEQ_IDX, False)
    assert [wins(sq, 4, 1, 32 * n, 1024) for n in (1023, 1024)] == [False, True]
    assert [wins(sq, 4, 1, 32, 512 * n, 4) for n in (1023, 1024)] == [False, True]
    assert wins(sq, 4, 1, 32 * 1023 + 1, 1024)  # a partial group of 32 channels counts
    assert not wins(sq, 4, 1, 8192, 2048) and not wins(sq, 4, 32, 512, 1024)  # the measured cells
    assert wins(sq, 4, 8, 4096, 4096) and [wins(sq, W, 1, 8192, 2048) for W in (2, 3, 5, 8)] == \
        [False, False, True, True]
    diff = ConvConfig(activation="silu", mode=SEQ_IDX, channels_last=False, states_channels_last=False,
                      want_final=False, backend="auto", differentiated=True)
    assert wins(diff, 4, 1, 8192, 2048) and wins(sq, 4, 1, 8192, 2048, backward=True)
    assert wins(cfg(SEQ_IDX, True), 4, 1, 2048, 8192)
    assert wins(sq, 4, 0, 0, 2048)  # (shape unknown: the kernel)
    # float32 at W = 2: XLA for a forward alone at any size; the kernel when
    # differentiated, for the backward, at W 3, in 16-bit types, channels-last
    assert [wins(sq, W, 8, 4096, 4096, 4) for W in (2, 3, 4)] == [False, True, True]
    assert not wins(sq, 2, 0, 0, 4096, 4)
    assert wins(diff, 2, 8, 4096, 4096, 4) and wins(sq, 2, 8, 4096, 4096, 4, backward=True)
    assert wins(sq, 2, 8, 4096, 4096, 2) and wins(cfg(SEQ_IDX, True), 2, 8, 4096, 4096, 4)
    assert wins(cfg(ROWS, False), 2, 8, 4096, 4096, 4)


def test_the_channels_last_forward():
    # channels-last: the kernel at every W past 1, float32 W = 2 dense alone
    # included (XLA's until the thirty-fifth session), with or without
    # states, differentiated or not, of any size
    def wins(c, W, size=4, backward=False, states=False):
        return gpu_kernel_wins(c, W, 4096, size, 8, 4096, backward, states)
    rows = cfg(ROWS, True)
    assert [wins(rows, W) for W in (1, 2, 3, 4)] == [False, True, True, True]
    assert gpu_kernel_wins(rows, 2, 4096, 4) and gpu_kernel_wins(rows, 2, 64, 4, 1, 16)
    assert wins(rows, 2, size=2) and wins(cfg(SEQ_IDX, True), 2)
    assert wins(rows, 2, states=True) and wins(rows, 2, backward=True)
    assert not wins(rows, 1, backward=True) and not wins(cfg(SEQ_IDX, True), 1)


def test_the_small_dense_forward():
    # channels-first dense at W 2..4 without states, a forward nothing
    # differentiates: XLA up to 2^24 elements (B * D * L); the kernel past
    # it, with states, when differentiated, for the backward, from W 5,
    # channels-last, and when the shape is unknown
    def wins(c, W, B, D, L, backward=False, states=False):
        return gpu_kernel_wins(c, W, L, 2, B, D, backward, states)
    rows = cfg(ROWS, False)
    assert [wins(rows, W, 1, 8192, 2048) for W in (2, 3, 4, 5, 8)] == [False, False, False, True, True]
    assert not wins(rows, 4, 32, 512, 1024)  # the two measured cells
    assert [wins(rows, 4, 1, 4096, 4096 + d) for d in (0, 8)] == [False, True]  # 2^24 + 4096 elements
    assert wins(rows, 4, 8, 4096, 4096)
    assert wins(rows, 4, 1, 8192, 2048, states=True) and wins(rows, 4, 1, 8192, 2048, backward=True)
    diff = ConvConfig(activation="silu", mode=ROWS, channels_last=False, states_channels_last=False,
                      want_final=False, backend="auto", differentiated=True)
    assert wins(diff, 4, 1, 8192, 2048)
    assert wins(cfg(ROWS, True), 4, 1, 8192, 2048) and wins(rows, 4, 0, 0, 2048)
    assert not wins(cfg(SEQ_IDX, False), 4, 1, 8192, 2048)  # (the seq_idx rule's own cell)
    assert wins(cfg(VARLEN, False), 4, 1, 8192, 2048)


def test_the_block_count_mirrors_the_kernels():
    # routing.py counts the shared-ids forward's blocks with the kernels'
    # constants written out (channels a block, steps a chunk): read them
    # from the CUDA headers, so that changing one there fails here
    root = os.path.join(os.path.dirname(__file__), "..", "cuda")
    if not os.path.isdir(root):
        pytest.skip("no cuda/ sources beside the tests")
    src = "".join(open(os.path.join(root, f)).read() for f in ("stream.cuh", "stream_ids.cuh"))
    const = lambda name: int(re.search(rf"constexpr int {name} = (\d+);", src).group(1))  # noqa: E731
    vecs = int(re.search(r"static constexpr int kVecs = (\d+);", src).group(1))
    per_block = const("kStreamWarps") * const("kIdChannels")
    for itemsize in (2, 4):
        chunk = 32 * vecs * (16 // itemsize)
        for B, D, L in [(1, per_block, chunk), (3, per_block + 1, chunk + 1), (2, 4096, 4096)]:
            want = B * -(-D // per_block) * -(-L // chunk)
            assert _seq_idx_forward_blocks(B, D, L, itemsize) == want


def test_the_cpu_table():
    f32, f64, bf16, f16 = jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16
    for cl in (False, True):
        fwd = lambda cfg, W, init=False, dt=bf16: cpu_kernel_wins(cfg, W, init, dt)  # noqa: E731
        bwd = lambda cfg, W, init=False, dt=bf16: cpu_kernel_wins(cfg, W, init, dt, backward=True)  # noqa: E731
        assert [fwd(cpu_cfg(ROWS, cl), W) for W in (1, 2, 3, 4, 64)] == [False, False, True, True, True]
        assert [fwd(cpu_cfg(SEQ_IDX, cl), W) for W in (1, 2, 3)] == [False, False, True]
        # states, varlen, a forward being differentiated: the kernel
        assert fwd(cpu_cfg(ROWS, cl), 2, True) and fwd(cpu_cfg(ROWS, cl, True), 2)
        assert fwd(cpu_cfg(VARLEN, cl), 2)
        assert all(fwd(cpu_cfg(m, cl, differentiated=True), W) for m in (ROWS, SEQ_IDX) for W in (1, 2))
        assert all(bwd(cpu_cfg(m, cl), W) for m in (ROWS, SEQ_IDX, VARLEN) for W in (1, 2, 3))
        # W = 1 channels-first float32 / float64 without states: XLA, forward and backward
        for dt in (f32, f64, f16, bf16):
            whole = not cl and dt in (f32, f64)
            for m in (ROWS, SEQ_IDX):
                assert fwd(cpu_cfg(m, cl, differentiated=True), 1, dt=dt) == (not whole)
                assert bwd(cpu_cfg(m, cl), 1, dt=dt) == (not whole)
            assert fwd(cpu_cfg(ROWS, cl, differentiated=True), 2, dt=dt) and bwd(cpu_cfg(ROWS, cl), 2, dt=dt)
            assert bwd(cpu_cfg(ROWS, cl), 1, True, dt) and bwd(cpu_cfg(ROWS, cl, True), 1, dt=dt)
            assert bwd(cpu_cfg(VARLEN, cl), 1, dt=dt)


def test_the_cpu_small_problem_table():
    bf16, f32 = jnp.bfloat16, jnp.float32
    small = routing.CPU_XLA_MAX_ELEMENTS

    def wins(mode, W, n, cl=False, init=False, final=False, dt=bf16):
        # (forward differentiated, backward): the same answer for both
        f = cpu_kernel_wins(cpu_cfg(mode, cl, final, True), W, init, dt, elements=n)
        b = cpu_kernel_wins(cpu_cfg(mode, cl, final), W, init, dt, backward=True, elements=n)
        assert f == b, "forward and backward must agree (the whole op)"
        return f
    for mode in (ROWS, SEQ_IDX):
        # W = 1: with or without states, at and past the bound
        assert not wins(mode, 1, small["w1"]) and wins(mode, 1, small["w1"] + 1)
        assert not wins(mode, 1, small["w1"], init=True, final=True)
        assert wins(mode, 1, small["w1"], cl=True)  # channels-last: the kernel
        assert wins(mode, 1, 0)  # size unknown: the kernel
        assert wins(VARLEN, 1, 100)
        # W = 2 without states
        bound = small["w2_seq_idx" if mode == SEQ_IDX else "w2_dense"]
        assert not wins(mode, 2, bound) and wins(mode, 2, bound + 1)
        assert not wins(mode, 2, bound, dt=f32)
        assert wins(mode, 2, bound, init=True) and wins(mode, 2, bound, final=True)
        assert wins(mode, 2, bound, cl=True)
        assert wins(mode, 3, 100) and wins(mode, 4, 100)  # a training step at W >= 3: the kernel
    assert small["w2_dense"] <= small["w2_seq_idx"] <= small["w1"]
    # the seq_idx forward alone at W >= 3 up to its dtype's bounds (not being differentiated)
    alone = lambda mode, W, n, cl=False, dt=bf16: cpu_kernel_wins(  # noqa: E731
        cpu_cfg(mode, cl), W, False, dt, elements=n)
    table = routing.CPU_XLA_SEQ_IDX_FORWARD
    assert table == {"bfloat16": {1 << 19: 8}, "float16": {1 << 21: 24},  # (docs/benchmarks.md's tables)
                     "float32": {1 << 19: 20, 1 << 21: 8}, "float64": {1 << 19: 20, 1 << 21: 5}}
    for dt in (bf16, jnp.float16, f32, jnp.float64):
        bounds = table[jnp.dtype(dt).name]
        for n, top in bounds.items():
            for W in (3, 4, 5, top):
                assert not alone(SEQ_IDX, W, n, dt=dt)
                assert alone(ROWS, W, n, dt=dt) and alone(SEQ_IDX, W, n, True, dt)
                assert alone(SEQ_IDX, W, 0, dt=dt)  # size unknown: the kernel
        assert alone(SEQ_IDX, max(bounds.values()) + 1, 1 << 19, dt=dt)  # past every width
        assert alone(SEQ_IDX, 3, max(bounds) + 1, dt=dt)  # past every size
        assert alone(SEQ_IDX, 64, 1 << 19, dt=dt) and alone(SEQ_IDX, 128, 1 << 19, dt=dt)
    # float32's two bounds: W 3..20 up to 2^19, W 3..8 up to 2^21
    assert not alone(SEQ_IDX, 20, 1 << 19, dt=f32) and alone(SEQ_IDX, 20, (1 << 19) + 1, dt=f32)
    assert not alone(SEQ_IDX, 8, 1 << 21, dt=f32) and alone(SEQ_IDX, 9, 1 << 20, dt=f32)
    assert alone(SEQ_IDX, 8, 1 << 20, dt=bf16)  # (16 bits: one bound, 2^19)


def test_the_cpu_short_forward_size_bound():
    """A forward alone at W <= 2 without states takes XLA up to
    CPU_XLA_FORWARD_MAX_BYTES of x (by bytes: twice the elements in 16
    bits), the kernel past it; any layout, dense or seq_idx. W = 1
    channels-first float32 keeps XLA at every size (the whole-op rule)."""
    limit = routing.CPU_XLA_FORWARD_MAX_BYTES
    for dt in (jnp.float32, jnp.bfloat16, jnp.float16):
        n = limit // jnp.dtype(dt).itemsize  # x of exactly the bound
        for cl in (False, True):
            for mode in (ROWS, SEQ_IDX):
                for W in (1, 2):
                    whole = W == 1 and not cl and dt == jnp.float32
                    assert not cpu_kernel_wins(cpu_cfg(mode, cl), W, False, dt, elements=n)
                    assert cpu_kernel_wins(cpu_cfg(mode, cl), W, False, dt, elements=n + 1) == (not whole)
                    assert not cpu_kernel_wins(cpu_cfg(mode, cl), W, False, dt)  # size unknown: XLA
                # states, or W = 3: the kernel at any size
                assert cpu_kernel_wins(cpu_cfg(mode, cl), 2, True, dt, elements=n)
                assert cpu_kernel_wins(cpu_cfg(mode, cl, final=True), 2, False, dt, elements=n)
                assert cpu_kernel_wins(cpu_cfg(mode, cl), 3, False, dt, elements=n + 1)


@pytest.mark.parametrize("W", [1, 2, 3, 8, 9, 64])
def test_cpu_small_problem_takes_xla(W, monkeypatch):
    """With the small-problem bounds above this array's size, a channels-first
    training step at W <= 2 compiles no call of ours (and the same values and
    gradients as the kernel's), a bfloat16 seq_idx forward alone at W = 3..8
    none; past the bounds, or at W 9, the kernel."""
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(2)
    # (bfloat16: at W = 1 in float32 channels-first XLA takes every size)
    x = jax.device_put(jnp.asarray(rng.standard_normal((2, 16, 40)), jnp.bfloat16), cpu)
    w = jax.device_put(jnp.asarray(rng.standard_normal((16, W)), jnp.bfloat16), cpu)
    s = jax.device_put(jnp.asarray(np.repeat([[0, 1, -1, 2]], 10, axis=1).repeat(2, 0), jnp.int32), cpu)

    def conv(backend, seq):
        return lambda x, w: jcc.causal_conv1d(x, w, activation="silu", seq_idx=seq, backend=backend)

    def step(backend, seq):
        return lambda x, w: jax.value_and_grad(
            lambda x, w: jnp.sum(conv(backend, seq)(x, w).astype(jnp.float32) ** 2), (0, 1))(x, w)
    bf16_top = max(routing.CPU_XLA_SEQ_IDX_FORWARD["bfloat16"].values())  # (x is bfloat16)
    for bound in (x.size, x.size - 1):
        _set_small_bounds(monkeypatch, bound)
        xla = bound >= x.size
        for seq in (None, s):
            if W <= 2:
                assert _calls(step("auto", seq), x, w) == ((0, 0) if xla else (1, 1))
                (va, ga), (vf, gf) = step("auto", seq)(x, w), step("ffi", seq)(x, w)
                np.testing.assert_allclose(va, vf, rtol=2e-2)
                for a, b in zip(ga, gf):
                    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                               rtol=2e-2, atol=2e-2)
            else:
                want = 0 if xla and seq is not None and W <= bf16_top else 1
                assert _calls(conv("auto", seq), x, w) == (want, 0)
                assert _calls(step("auto", seq), x, w) == (1, 1)  # W >= 3: the kernel in a step
                if seq is not None:  # the routed forward's values are the kernel's
                    np.testing.assert_allclose(np.asarray(conv("auto", seq)(x, w), np.float32),
                                               np.asarray(conv("ffi", seq)(x, w), np.float32), rtol=2e-2, atol=2e-2)
        assert _calls(step("ffi", s), x, w) == (1, 1)
    jax.clear_caches()


def _calls(f, *args):
    """Our forward and backward calls in f's compiled program."""
    txt = jax.jit(f).lower(*args).compile().as_text()
    return txt.count(targets.FORWARD), txt.count(targets.BACKWARD)


def _kernel_calls(f, *args):
    return _calls(f, *args)[0]


@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("W", [2, 3])
def test_cpu_short_forward_takes_xla_outside_training(W, cl, no_small_rule, monkeypatch):
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(0)
    x = jax.device_put(jnp.asarray(rng.standard_normal((2, 40, 16) if cl else (2, 16, 40)), jnp.float32), cpu)
    w = jax.device_put(jnp.asarray(rng.standard_normal((16, W)), jnp.float32), cpu)
    s = jax.device_put(jnp.asarray(np.repeat([[0, 1, -1, 2]], 10, axis=1).repeat(2, 0), jnp.int32), cpu)

    def conv(backend, seq=None, init=None):
        return lambda x, w: jcc.causal_conv1d(x, w, activation="silu", seq_idx=seq, initial_states=init,
                                              channels_last=cl, backend=backend)
    routed = W <= 2
    assert _calls(conv("auto"), x, w) == (0 if routed else 1, 0)
    assert _calls(conv("auto", s), x, w) == (0 if routed else 1, 0)
    assert _calls(conv("ffi"), x, w) == (1, 0)
    init = jnp.ones((2, W - 1, 16) if cl else (2, 16, W - 1), jnp.float32)
    assert _calls(conv("auto", init=init), x, w) == (1, 0)  # states: the kernel
    # a training step keeps the kernel's forward (and the backward), routed or not
    step = lambda x, w: jax.value_and_grad(lambda x, w: jnp.sum(conv("auto", s)(x, w) ** 2), (0, 1))(x, w)  # noqa: E731
    assert _calls(step, x, w) == (1, 1)
    # (a vjp too: its forward is the differentiated one)
    assert _calls(lambda x, w: jax.vjp(conv("auto"), x, w)[0], x, w) == (1, 0)
    # past the size bound (moved under x's bytes here) the kernel
    _set_forward_bound(monkeypatch, x.nbytes - 1)
    assert _calls(conv("auto"), x, w) == (1, 0) and _calls(conv("auto", s), x, w) == (1, 0)
    _set_forward_bound(monkeypatch, x.nbytes)
    assert _calls(conv("auto"), x, w) == (0 if routed else 1, 0)
    # the same values either way
    np.testing.assert_allclose(conv("auto", s)(x, w), conv("ffi", s)(x, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(conv("auto")(x, w), conv("ffi")(x, w), rtol=1e-5, atol=1e-5)
    ga = jax.grad(lambda x, w: jnp.sum(conv("auto", s)(x, w) ** 2), (0, 1))(x, w)
    gf = jax.grad(lambda x, w: jnp.sum(conv("ffi", s)(x, w) ** 2), (0, 1))(x, w)
    for a, b in zip(ga, gf):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("cl", [False, True])
def test_cpu_w1_float32_step_takes_xla(cl, dtype, no_small_rule):
    """A training step at W = 1 channels-first in float32: XLA's twin,
    forward and backward (no call of ours); channels-last or 16-bit: ours.
    The same values and gradients as the kernel's either way."""
    cpu = jax.devices("cpu")[0]
    rng = np.random.default_rng(1)
    x = jax.device_put(jnp.asarray(rng.standard_normal((2, 40, 16) if cl else (2, 16, 40)), dtype), cpu)
    w = jax.device_put(jnp.asarray(rng.standard_normal((16, 1)), dtype), cpu)
    s = jax.device_put(jnp.asarray(np.repeat([[0, 1, -1, 2]], 10, axis=1).repeat(2, 0), jnp.int32), cpu)

    def step(backend, seq=None):
        def loss(x, w):
            y = jcc.causal_conv1d(x, w, activation="silu", seq_idx=seq, channels_last=cl, backend=backend)
            return jnp.sum(y.astype(jnp.float32) ** 2)
        return lambda x, w: jax.value_and_grad(loss, (0, 1))(x, w)
    ours = cl or dtype != jnp.float32
    for seq in (None, s):
        assert _calls(step("auto", seq), x, w) == ((1, 1) if ours else (0, 0))
        assert _calls(step("ffi", seq), x, w) == (1, 1)
        (va, ga), (vf, gf) = step("auto", seq)(x, w), step("ffi", seq)(x, w)
        tol = 1e-5 if dtype == jnp.float32 else 2e-2
        np.testing.assert_allclose(va, vf, rtol=tol)
        for a, b in zip(ga, gf):
            np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)
    init = jnp.ones((2, 0, 16) if cl else (2, 16, 0), dtype)
    with_states = lambda x, w: jax.grad(lambda x, w: jnp.sum(jcc.causal_conv1d(  # noqa: E731
        x, w, initial_states=init, channels_last=cl).astype(jnp.float32)), (0, 1))(x, w)
    assert _calls(with_states, x, w)[1] == 1  # states: the kernel


@pytest.mark.parametrize("cl", [False, True])
def test_cpu_takes_the_kernel_past_w2(cl, no_small_rule):
    cpu = jax.devices("cpu")[0]
    x = jax.device_put(jnp.ones((1, 8, 16) if not cl else (1, 16, 8), jnp.float32), cpu)
    w = jax.device_put(jnp.ones((8, 4), jnp.float32), cpu)
    s = jax.device_put(jnp.zeros((1, 16), jnp.int32), cpu)
    f = lambda x, w, s: jcc.causal_conv1d(x, w, seq_idx=s, channels_last=cl)  # noqa: E731
    assert _kernel_calls(f, x, w, s) == 1


@MARKS[0]
@MARKS[1]
@pytest.mark.skipif(DRY_RUN, reason="GPU routing (a dry run on the CPU)")
def test_gpu_auto_routes_and_ffi_insists():
    g = GPU
    rng = np.random.default_rng(0)
    x = jax.device_put(jnp.asarray(rng.standard_normal((2, 16, 64)), jnp.float32), g)
    w = jax.device_put(jnp.asarray(rng.standard_normal((16, 4)), jnp.float32), g)
    s = jax.device_put(jnp.asarray(np.repeat(np.arange(4), 16)[None].repeat(2, 0), jnp.int32), g)
    w32 = jax.device_put(jnp.asarray(rng.standard_normal((16, 32)) / 32, jnp.float32), g)
    auto = lambda x, w, s: jcc.causal_conv1d(x, w, seq_idx=s)  # noqa: E731
    ffi = lambda x, w, s: jcc.causal_conv1d(x, w, seq_idx=s, backend="ffi")  # noqa: E731
    # rows of partial vectors at W = 32 (the tile family): XLA, unless "ffi"
    x66, s66 = x[:, :, :2].repeat(33, axis=2), s[:, :2].repeat(33, axis=1)
    assert _kernel_calls(auto, x66, w32, s66) == 0 and _kernel_calls(ffi, x66, w32, s66) == 1
    np.testing.assert_allclose(jax.jit(auto)(x66, w32, s66), jax.jit(ffi)(x66, w32, s66), rtol=1e-5, atol=1e-5)
    assert _kernel_calls(auto, x, w32, s) == 1  # whole vectors at W = 32: the wide family
    # seq_idx at W = 4, a forward alone on too few blocks: XLA, unless "ffi";
    # in a training step (the forward kept) and at W = 5 the kernel
    assert _kernel_calls(auto, x, w, s) == 0 and _kernel_calls(ffi, x, w, s) == 1
    step = lambda x, w, s: jax.value_and_grad(lambda x: jnp.sum(auto(x, w, s) ** 2))(x)  # noqa: E731
    assert _calls(step, x, w, s) == (1, 1)
    assert _kernel_calls(auto, x, w32[:, :5], s) == 1
    xl = jnp.swapaxes(x, 1, 2)
    cl = lambda x, w, s: jcc.causal_conv1d(x, w, seq_idx=s, channels_last=True)  # noqa: E731
    assert _kernel_calls(cl, xl, w32, s) == 1
    # a small channels-first dense forward alone at W = 4: XLA, unless "ffi";
    # with initial states, in a training step and at W = 5 the kernel
    dense = lambda x, w, h=None, backend="auto": jcc.causal_conv1d(  # noqa: E731
        x, w, initial_states=h, backend=backend)
    h = jnp.zeros((2, 16, 3), x.dtype)
    assert _kernel_calls(dense, x, w) == 0 and _kernel_calls(lambda x, w: dense(x, w, backend="ffi"), x, w) == 1
    assert _kernel_calls(dense, x, w, h) == 1 and _kernel_calls(dense, x, w32[:, :5]) == 1
    assert _calls(lambda x, w: jax.value_and_grad(lambda x: jnp.sum(dense(x, w) ** 2))(x), x, w) == (1, 1)
