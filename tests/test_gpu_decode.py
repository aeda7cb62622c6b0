"""The CUDA decode kernels (causal_conv1d_update, varlen_states) against the
CPU kernels and the reference: both state layouts, every mode, the vector
hot paths and their staged / multi-row variants, vmap groups, and the
update inside a scan. Skipped unless a GPU is visible and the CUDA module
was built; names containing "small" join the reduced grid (tests/test_gpu.py)."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import jax_causal_conv as jcc

from gpu_support import CPU, DRY_RUN, DT, GPU, MARKS, REL, check, run

pytestmark = MARKS


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [2, 4, 5])
@pytest.mark.parametrize("S", [1, 3])
def test_small_update_channels_last(dtype, W, S):
    """Channels-last decode (x (B, S, D), state (N, state_len, D)) against the
    CPU kernel, every mode; one token with state_len = W - 1 takes the
    channels-last vector kernel."""
    rng = np.random.default_rng(W * 10 + S + 1)
    dt = DT[dtype]
    for B, D, SL, slots in ((5, 36, max(W - 1, 0) + 2, 9), (6, 64, W - 1, 9), (130, 1024, W - 1, 131)):
        x = jnp.asarray(rng.standard_normal((B, D) if S == 1 else (B, S, D)), dt)
        st = jnp.asarray(rng.standard_normal((slots, SL, D)), dt)
        w = jnp.asarray(rng.standard_normal((D, W)), dt)
        b = jnp.asarray(rng.standard_normal((D,)), dt)
        seqlens = jnp.asarray(rng.integers(-3, 50, B), jnp.int32)
        idx = np.asarray(rng.permutation(slots)[:B], np.int32)
        idx[1::7] = -1
        for kw in ({}, {"cache_seqlens": seqlens}, {"conv_state_indices": jnp.asarray(idx)},
                   {"cache_seqlens": seqlens, "conv_state_indices": jnp.asarray(idx)}):
            f = lambda x, st: jcc.causal_conv1d_update(x, st, w, b, activation="silu",
                                                       channels_last=True, backend="ffi", **kw)
            check(f, (x, st), dtype, f"update cl {sorted(kw)}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_update_channels_last_wide_words(dtype):
    """The channels-last vector kernel moves 8-byte channel words while its
    grid fits on the GPU at once (the small test's shapes) and 16-byte words
    past that: a batch of 512 x 8192 channels takes the 16-byte kernel."""
    rng = np.random.default_rng(7)
    dt = DT[dtype]
    B, D, W, slots = 512, 8192, 4, 600
    x = jnp.asarray(rng.standard_normal((B, D)), dt)
    st = jnp.asarray(rng.standard_normal((slots, W - 1, D)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)), dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    idx = np.asarray(rng.permutation(slots)[:B], np.int32)
    idx[1::7] = -1
    seqlens = jnp.asarray(rng.integers(0, 50, B), jnp.int32)
    for kw in ({}, {"cache_seqlens": seqlens, "conv_state_indices": jnp.asarray(idx)}):
        f = lambda x, st: jcc.causal_conv1d_update(x, st, w, b, activation="silu",
                                                   channels_last=True, backend="ffi", **kw)
        check(f, (x, st), dtype, f"update cl wide words {sorted(kw)}")


def test_small_varlen_states_channels_last():
    rng = np.random.default_rng(2)
    cu = jnp.asarray([0, 5, 5, 40, 41, 300], jnp.int32)
    x = jnp.asarray(rng.standard_normal((300, 24)), jnp.bfloat16)
    for sl in (1, 3, 7):
        f = lambda x: jcc.causal_conv1d_varlen_states(x, cu, sl, channels_last=True, backend="ffi")
        check(f, (x,), "bfloat16", "varlen_states cl")


def check_update_modes(x, st, w, b, dtype, seqlens, idx):
    """GPU vs CPU kernel vs reference, rolling / circular, with and without slot
    indices (idx[1] == -1: a padding row, whose output must be zeros)."""
    for kw in ({}, {"cache_seqlens": seqlens}, {"conv_state_indices": idx},
               {"cache_seqlens": seqlens, "conv_state_indices": idx}):
        f = lambda x, st: jcc.causal_conv1d_update(x, st, w, b, activation="silu", backend="ffi", **kw)
        got = check(f, (x, st), dtype, f"update {sorted(kw)}")
        ref = run(CPU, lambda x, st: jcc.reference.causal_conv1d_update(x, st, w, b, activation="silu", **kw), x, st)
        for g, r in zip(got, ref):
            err = np.max(np.abs(g - r)) / max(1.0, np.max(np.abs(r)))
            assert err <= REL[dtype], f"update vs reference {sorted(kw)}: {err}"
        if "conv_state_indices" in kw:
            assert np.all(got[0][1] == 0)


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("W", [1, 2, 4, 5, 8, 9])
@pytest.mark.parametrize("S", [1, 3, 7])
def test_small_update(dtype, W, S):
    rng = np.random.default_rng(W * 10 + S)
    B, D, SL, slots = 5, 36, max(W - 1, 0) + 2, 9
    dt = DT[dtype]
    x = jnp.asarray(rng.standard_normal((B, D, S)), dt)
    st = jnp.asarray(rng.standard_normal((slots, D, SL)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((D,)), jnp.float32)
    check_update_modes(x, st, w, b, dtype, jnp.asarray([0, 3, 7, -2, 100], jnp.int32),
                       jnp.asarray([4, -1, 0, 8, 2], jnp.int32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("S,extra", [(1, 0), (1, 3), (3, 0), (4, 1), (9, 4)])
def test_small_update_ring_staged(dtype, W, S, extra):
    """The channels-first ring / multi-token kernel with its state blocks staged
    through shared memory (dim a multiple of 128; the rolling cases with
    extra > 0 take the general kernel)."""
    rng = np.random.default_rng(W * 100 + S * 10 + extra)
    B, D, SL, slots = 5, 256, W - 1 + extra, 9
    dt = DT[dtype]
    x = jnp.asarray(rng.standard_normal((B, D, S)), dt)
    st = jnp.asarray(rng.standard_normal((slots, D, SL)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)), dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    check_update_modes(x, st, w, b, dtype, jnp.asarray([0, 3, 7, -2, 100], jnp.int32),
                       jnp.asarray([4, -1, 0, 8, 2], jnp.int32))


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("W", [2, 3, 4])
@pytest.mark.parametrize("wdtype", ["float32", "same"])
def test_small_update_vector_path(dtype, W, wdtype):
    """One token, state_len = W - 1, dim a multiple of 4 (not of 8, so rows
    of x and the state are 8-byte but not 16-byte multiples): the vector
    kernel, 4 channels per thread."""
    rng = np.random.default_rng(W * 7 + len(dtype))
    B, D, slots = 6, 52, 9
    dt = DT[dtype]
    wt = dt if wdtype == "same" else jnp.float32
    x = jnp.asarray(rng.standard_normal((B, D)), dt)
    st = jnp.asarray(rng.standard_normal((slots, D, W - 1)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)), wt)
    b = jnp.asarray(rng.standard_normal((D,)), wt)
    check_update_modes(x, st, w, b, dtype, jnp.asarray([0, 1, 2, 7, -5, 100], jnp.int32),
                       jnp.asarray([4, -1, 0, 8, 2, 5], jnp.int32))
    f = lambda x, st: jcc.causal_conv1d_update(x, st, w, None, backend="ffi")
    check(f, (x, st), dtype, "update, no bias")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("B, D", [(6, 256), (600, 2048), (100, 4096), (700, 1028), (4200, 264)])
def test_update_staged_and_multirow(dtype, B, D):
    """The decode kernel's variants on an H100/H200 (132 SMs): (6, 256), 4
    channels and one row per thread (4-channel rows are never staged);
    (600, 2048), more threads than the GPU holds at once, so 8 channels and
    several rows per thread, the next row's loads in flight, each warp moving
    its state rows through shared memory (dim / 8 a multiple of 32);
    (100, 4096), too many threads for 4 channels, one row each at 8
    (bfloat16); (700, 1028), 4 channels (dim % 8 != 0), several rows per
    thread; (4200, 264), 8 channels and several rows per thread, not staged
    (dim / 8 = 33)."""
    rng = np.random.default_rng(B + D)
    dt, W, slots = DT[dtype], 4, B + 3
    x = jnp.asarray(rng.standard_normal((B, D)), dt)
    st = jnp.asarray(rng.standard_normal((slots, D, W - 1)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)), dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    seqlens = jnp.asarray(rng.integers(-3, 50, B), jnp.int32)
    idx = np.asarray(rng.permutation(slots)[:B], np.int32)
    idx[1::7] = -1  # padding rows, whole warps of them
    check_update_modes(x, st, w, b, dtype, seqlens, jnp.asarray(idx))


@pytest.mark.skipif(DRY_RUN, reason="XLA:GPU behaviour (a dry run on the CPU)")
def test_update_scan_keeps_the_slices_out_of_the_call(monkeypatch):
    """A small decode step inside lax.scan: XLA does not fold the slice of xs
    and the write into ys into our custom call (the barriers of
    _calls._ffi_update; with that fusion the loop body left command buffers
    and each step cost a host launch), and the scan matches the CPU kernels.
    Control: without the barriers XLA does form that fusion here."""
    rng = np.random.default_rng(5)
    B, D, W, T = 4, 256, 4, 9
    xs = jnp.asarray(rng.standard_normal((T, B, D)), jnp.bfloat16)
    st = jnp.asarray(rng.standard_normal((B, D, W - 1)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((D, W)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((D,)), jnp.bfloat16)

    def f(st, xs):
        def body(s, x):
            y, s = jcc.causal_conv1d_update(x, s, w, b, activation="silu", backend="ffi")
            return s, y
        return lax.scan(body, st, xs)

    def slice_fused():
        hlo = jax.jit(f).lower(jax.device_put(st, GPU), jax.device_put(xs, GPU)).compile().as_text()
        assert "custom-call" in hlo
        return "dynamic-slice-fusion" in hlo or "dynamic_slice_fusion" in hlo

    assert not slice_fused()
    check(f, (st, xs), "bfloat16", "update in scan")
    from jax_causal_conv._lowering import ffi_calls as _calls
    monkeypatch.setattr(_calls, "NO_SLICE_FUSION_MAX_BYTES", 0)
    jax.clear_caches()  # trace again, now without the barriers
    assert slice_fused(), "XLA no longer forms the fusion: the barriers may be obsolete"
    jax.clear_caches()


@pytest.mark.parametrize("cl", [False, True])
def test_update_vmap_groups_multirow(cl):
    """vmap over the weights: one launch with 3 weight groups of 200 rows,
    whose row runs per thread straddle the group boundaries (both state
    layouts: each takes several rows a thread past one wave of the GPU)."""
    rng = np.random.default_rng(3)
    G, B, D, W = 3, 200, 2048, 4
    xs = jnp.asarray(rng.standard_normal((G, B, D)), jnp.bfloat16)
    sts = jnp.asarray(rng.standard_normal((G, B, W - 1, D) if cl else (G, B, D, W - 1)), jnp.bfloat16)
    ws = jnp.asarray(rng.standard_normal((G, D, W)), jnp.bfloat16)
    bs = jnp.asarray(rng.standard_normal((G, D)), jnp.bfloat16)
    f = lambda xs, sts, ws, bs: jax.vmap(
        lambda x, s, w, b: jcc.causal_conv1d_update(x, s, w, b, activation="silu", channels_last=cl,
                                                    backend="ffi"))(xs, sts, ws, bs)
    got = check(f, (xs, sts, ws, bs), "bfloat16", "vmap update")
    ref = run(CPU, lambda *a: jax.vmap(lambda x, s, w, b: jcc.reference.causal_conv1d_update(
        x, s, w, b, activation="silu", channels_last=cl))(*a), xs, sts, ws, bs)
    for g, r in zip(got, ref):
        assert np.max(np.abs(g - r)) / max(1.0, np.max(np.abs(r))) <= REL["bfloat16"]
