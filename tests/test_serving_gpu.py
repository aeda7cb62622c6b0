"""Serving features on the GPU: the channels-last decode update and
varlen_states (CUDA kernels against our CPU kernels), speculative decoding
through the ring (random accept/reject schedules against feeding only the
accepted tokens), the Flax ring decode and prefix snapshots.

Skipped unless a GPU is visible and the CUDA module was built (as
tests/test_gpu.py). Run: ``PYTHONPATH=src python -m pytest -q -m gpu tests/test_serving_gpu.py``;
names containing "small" form the reduced grid for compute-sanitizer runs.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_causal_conv as jcc
from jax_causal_conv._lowering import targets as _ffi

import oracle_decode
import spec_schedule

from gpu_support import CPU, DT, GPU, MARKS, REL, check, rel_err, run

pytestmark = MARKS


def _slots(B, N, seed, pad_every):
    """Distinct slots (a permutation of the pool), every pad_every-th row padding."""
    s = np.random.default_rng(seed).permutation(N)[:B]
    return jnp.asarray(np.where(np.arange(B) % pad_every == 1, -1, s), jnp.int32)


MODES = {
    "rolling": lambda B, N: {},
    "circular": lambda B, N: dict(cache_seqlens=jnp.asarray((np.arange(B) * 7) % 23, jnp.int32)),
    "slots": lambda B, N: dict(conv_state_indices=_slots(B, N, 0, 5)),
    "slots_circular": lambda B, N: dict(
        cache_seqlens=jnp.asarray((np.arange(B) * 5 + 2) % 19, jnp.int32),
        conv_state_indices=_slots(B, N, 1, 4)),
}


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("W,extra", [(2, 0), (3, 2), (4, 0), (5, 3)])
@pytest.mark.parametrize("S", [None, 1, 4])
@pytest.mark.parametrize("B,D", [(5, 8), (3, 520)])
def test_small_channels_last_update(dtype, mode, W, extra, S, B, D):
    """GPU vs CPU, and the channels-last call vs the channels-first one on the GPU."""
    _update_case(dtype, mode, W, extra, S, B, D)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("S", [None, 4])
@pytest.mark.parametrize("B,D", [(64, 4096), (256, 8192)])
def test_channels_last_update_serving_sizes(dtype, mode, S, B, D):
    _update_case(dtype, mode, 4, 0, S, B, D)


def _update_case(dtype, mode, W, extra, S, B, D):
    rng = np.random.default_rng(W * 13 + extra + (S or 0) + D)
    dt = DT[dtype]
    N, SL = B + 2, W - 1 + extra
    x = jnp.asarray(rng.standard_normal((B, D) if S is None else (B, S, D)), dt)
    st = jnp.asarray(rng.standard_normal((N, SL, D)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    kw = MODES[mode](B, N)

    def f(x, st):
        return jcc.causal_conv1d_update(x, st, w, b, activation="silu", channels_last=True,
                                        backend="ffi", **kw)

    got = check(f, (x, st), dtype, f"cl update {mode}")

    def g(x, st):  # channels-first on transposed arrays, back to channels-last
        xf = x if S is None else jnp.swapaxes(x, 1, 2)
        y, s = jcc.causal_conv1d_update(xf, jnp.swapaxes(st, 1, 2), w, b, activation="silu",
                                        backend="ffi", **kw)
        return (y if S is None else jnp.swapaxes(y, 1, 2)), jnp.swapaxes(s, 1, 2)

    cf = run(GPU, g, x, st)
    for a, c in zip(got, cf):
        assert rel_err(a, c) <= REL[dtype]


@pytest.mark.parametrize("dtype", list(DT))
@pytest.mark.parametrize("state_len", [1, 3, 8])
def test_small_channels_last_varlen_states(dtype, state_len):
    rng = np.random.default_rng(state_len)
    x = jnp.asarray(rng.standard_normal((61, 264)), DT[dtype])
    cu = jnp.asarray([0, 0, 2, 30, 31, 61], jnp.int32)
    got = check(lambda x: jcc.causal_conv1d_varlen_states(x, cu, state_len, channels_last=True,
                                                          backend="ffi"), (x,), dtype, "vs cl")
    cf = run(GPU, lambda x: jnp.swapaxes(jcc.causal_conv1d_varlen_states(x, cu, state_len,
                                                                         backend="ffi"), 1, 2), x)
    np.testing.assert_array_equal(got, cf)


def test_channels_last_update_in_place_on_gpu():
    B, D, W = 64, 4096, 4
    w = jax.device_put(jnp.ones((D, W), jnp.bfloat16), GPU)
    step = jax.jit(lambda x, s, c: jcc.causal_conv1d_update(x, s, w, channels_last=True,
                                                           cache_seqlens=c), donate_argnums=1)
    x = jax.device_put(jnp.ones((B, D), jnp.bfloat16), GPU)
    st = jax.device_put(jnp.zeros((B, W + 2, D), jnp.bfloat16), GPU)
    cs = jax.device_put(jnp.zeros((B,), jnp.int32), GPU)
    hlo = step.lower(x, st, cs).compile().as_text()
    assert _ffi.UPDATE in hlo and "transpose(" not in hlo
    ptr = st.unsafe_buffer_pointer()
    _, new = step(x, st, cs)
    assert new.unsafe_buffer_pointer() == ptr


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("W,S,D", [(4, 1, 64), (4, 4, 520), (2, 3, 8), (5, 6, 4096)])
def test_speculative_schedule_on_gpu(dtype, cl, W, S, D):
    """Outputs and states equal feeding only the accepted tokens (on the GPU),
    and the GPU run equals the CPU run of the same schedule."""
    kw = dict(B=3, D=D, W=W, S=S, SL=W - 1 + S, steps=6, cl=cl, dtype=DT[dtype], slots=True,
              backend="ffi")
    out = spec_schedule.run(np.random.default_rng(S * 10 + W), device=GPU, **kw)
    ref = spec_schedule.run(np.random.default_rng(S * 10 + W), device=CPU, **kw)
    tol = REL[dtype]
    for r in range(3):
        assert rel_err(out["spec"][r], out["base"][r]) <= tol
        assert rel_err(out["spec_window"][r], out["base_window"][r]) == 0  # raw copies
        assert rel_err(out["spec"][r], ref["spec"][r]) <= tol
        n = out["accepted"][r]
        xs = np.asarray(jnp.asarray(out["streams"][r, :n], DT[dtype]).astype(jnp.float32),
                        np.float64)
        want = oracle_decode.stream(xs.T, out["w"], out["b"], "silu").T
        assert rel_err(out["spec"][r], want) <= 2 * tol
    assert rel_err(out["next_spec"][:3], out["next_base"][:3]) <= tol
    assert not out["pad_out"].any()


def test_flax_ring_decode_on_gpu():
    from jax_causal_conv.flax import CausalConv1d, accept
    B, D, W, K = 4, 256, 4, 3
    x = jax.device_put(jax.random.normal(jax.random.key(0), (B, 40, D)), GPU)
    m = CausalConv1d(D, kernel_size=W, activation="silu", speculative_tokens=K)
    params = m.init(jax.random.key(1), x)["params"]
    full = np.asarray(m.apply({"params": params}, x))
    cache = m.init(jax.random.key(0), x, decode=True)["cache"]
    step = jax.jit(lambda p, c, xs: m.apply({"params": p, "cache": c}, xs, decode=True,
                                            mutable=["cache"]), donate_argnums=1)
    y, mut = step(params, cache, x[:, :20])            # prefill (full convolution)
    np.testing.assert_allclose(y, full[:, :20], rtol=1e-4, atol=1e-4)
    cache, t = mut["cache"], 20
    rng = np.random.default_rng(0)
    while t + K + 1 <= 40:
        drafts = jnp.concatenate([x[:, t:t + 2], jnp.asarray(rng.standard_normal((B, K - 1, D)),
                                                             jnp.float32)], axis=1)
        y, mut = step(params, cache, drafts)          # verify K+1 tokens, keep 2
        np.testing.assert_allclose(y[:, :2], full[:, t:t + 2], rtol=1e-4, atol=1e-4)
        cache, t = accept(mut["cache"], 2), t + 2


def test_prefix_snapshots_on_gpu():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((50, 128)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((128, 4)), jnp.bfloat16)
    cu = jnp.asarray([0, 13, 13, 50], jnp.int32)
    check(lambda x: jcc.causal_conv1d_varlen(x, w, cu_seqlens=cu, block_size=4, max_blocks=10,
                                             backend="ffi"), (x,), "bfloat16", "snapshots")
