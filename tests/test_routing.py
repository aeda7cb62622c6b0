"""backend="auto" on a GPU takes XLA's shifted sum in the cells where our
kernel measured slower (routing.py); "ffi" still insists on the kernel, and
every other platform takes the kernel."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_causal_conv as jcc
from jax_causal_conv._lowering import targets
from jax_causal_conv._lowering.config import ROWS, SEQ_IDX, VARLEN, ConvConfig
from jax_causal_conv._lowering.routing import gpu_kernel_wins

from gpu_support import GPU, MARKS


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


def _kernel_calls(f, *args):
    txt = jax.jit(f).lower(*args).compile().as_text()
    return txt.count(targets.FORWARD)


@pytest.mark.parametrize("cl", [False, True])
def test_cpu_always_takes_the_kernel(cl):
    cpu = jax.devices("cpu")[0]
    x = jax.device_put(jnp.ones((1, 8, 16) if not cl else (1, 16, 8), jnp.float32), cpu)
    w = jax.device_put(jnp.ones((8, 4), jnp.float32), cpu)
    s = jax.device_put(jnp.zeros((1, 16), jnp.int32), cpu)
    f = lambda x, w, s: jcc.causal_conv1d(x, w, seq_idx=s, channels_last=cl)  # noqa: E731
    assert _kernel_calls(f, x, w, s) == 1


@MARKS[0]
@MARKS[1]
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
    assert _kernel_calls(auto, x, w, s) == 1  # seq_idx at W = 4 takes the kernel
    xl = jnp.swapaxes(x, 1, 2)
    cl = lambda x, w, s: jcc.causal_conv1d(x, w, seq_idx=s, channels_last=True)  # noqa: E731
    assert _kernel_calls(cl, xl, w32, s) == 1
