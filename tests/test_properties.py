"""Property tests (hypothesis): every entry point against the reference over
random shapes, widths, dtypes, layouts, seq_idx patterns, states, varlen splits
and decode schedules.

A short profile runs in CI; the long one (>= 10,000 examples per property) runs
on demand:  JCC_HYPOTHESIS_PROFILE=long pytest tests/test_properties.py
"""

import os

import jax.numpy as jnp
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import jax_causal_conv as jcc  # noqa: E402
from jax_causal_conv import reference  # noqa: E402

from helpers import close  # noqa: E402

settings.register_profile("ci", max_examples=10, deadline=None, derandomize=True,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("long", max_examples=10_000, deadline=None,
                          suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("JCC_HYPOTHESIS_PROFILE", "ci"))

# With JCC_HYPOTHESIS_LOG=FILE each passing example appends a line there, so a
# long run stopped by a time limit still says how far it got.
_LOG = os.environ.get("JCC_HYPOTHESIS_LOG")


def _passed(name):
    if _LOG:
        with open(_LOG, "a") as f:
            f.write(name + "\n")

DT = st.sampled_from([jnp.float32, jnp.float64, jnp.bfloat16, jnp.float16])


def _arr(seed, shape, dtype):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


# Sizes come from small sets so that repeated shapes reuse compiled kernels and
# the long profile stays affordable; the values within them are fully random.
@given(B=st.sampled_from([1, 3]), D=st.sampled_from([1, 5, 20]), L=st.sampled_from([1, 2, 7, 40]),
       W=st.sampled_from([1, 2, 3, 4, 5, 9]),
       dtype=DT, cl=st.booleans(), bias=st.booleans(), act=st.sampled_from([None, "silu"]),
       mode=st.sampled_from(["plain", "seq_idx", "states"]), residual=st.booleans(),
       n_seq=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_conv_property(B, D, L, W, dtype, cl, bias, act, mode, residual, n_seq, seed):
    xs = (B, L, D) if cl else (B, D, L)
    x = _arr(seed, xs, dtype)
    w = _arr(seed + 1, (D, W), jnp.float32)
    b = _arr(seed + 2, (D,), jnp.float32) if bias else None
    r = _arr(seed + 3, xs, dtype) if residual else None
    s = (jnp.asarray(np.sort(np.random.default_rng(seed).integers(0, n_seq, (B, L)), axis=1),
                     jnp.int32) if mode == "seq_idx" else None)
    h = _arr(seed + 4, (B, W - 1, D) if cl else (B, D, W - 1), dtype) if mode == "states" else None
    kw = dict(activation=act, residual=r, seq_idx=s, initial_states=h, return_final_states=True,
              channels_last=cl)
    y, f = jcc.causal_conv1d(x, w, b, backend="ffi", **kw)
    yr, fr = reference.causal_conv1d(x, w, b, **kw)
    close(y, yr, dtype, 1 + float(jnp.abs(yr.astype(jnp.float32)).max()))
    np.testing.assert_array_equal(np.asarray(f.astype(jnp.float32)), np.asarray(fr.astype(jnp.float32)))
    _passed("conv")


@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=6), D=st.sampled_from([1, 9]),
       W=st.sampled_from([1, 2, 4, 6]), states=st.booleans(), dtype=DT, seed=st.integers(0, 2**31))
def test_varlen_property(lengths, D, W, states, dtype, seed):
    cu = jnp.asarray(np.concatenate([[0], np.cumsum(lengths)]), jnp.int32)
    T, N = int(cu[-1]), len(lengths)
    x = _arr(seed, (T, D), dtype)
    w = _arr(seed + 1, (D, W), jnp.float32)
    h = _arr(seed + 2, (N, D, W - 1), dtype) if states else None
    y, f = jcc.causal_conv1d_varlen(x, w, cu_seqlens=cu, initial_states=h, activation="silu",
                                    return_final_states=True)
    yr, fr = reference.causal_conv1d_varlen(x, w, cu_seqlens=cu, initial_states=h,
                                            activation="silu", return_final_states=True)
    close(y, yr, dtype, 1 + float(jnp.abs(yr.astype(jnp.float32)).max(initial=0)))
    np.testing.assert_array_equal(np.asarray(f.astype(jnp.float32)), np.asarray(fr.astype(jnp.float32)))
    sl = W + 1
    np.testing.assert_array_equal(
        np.asarray(jcc.causal_conv1d_varlen_states(x, cu, sl).astype(jnp.float32)),
        np.asarray(reference.causal_conv1d_varlen_states(x, cu, sl).astype(jnp.float32)))
    _passed("varlen")


@given(chunks=st.lists(st.integers(1, 5), min_size=1, max_size=6), D=st.sampled_from([1, 9]),
       W=st.sampled_from([1, 2, 4, 6]), extra=st.sampled_from([0, 3]), circular=st.booleans(),
       start=st.integers(0, 9), seed=st.integers(0, 2**31))
def test_decode_schedule_property(chunks, D, W, extra, circular, start, seed):
    """Any schedule of multi-token updates equals one full convolution."""
    B, L = 2, sum(chunks)
    SL = W - 1 + extra
    x = _arr(seed, (B, D, L), jnp.float32)
    w = _arr(seed + 1, (D, W), jnp.float32)
    state = jnp.zeros((B, D, SL))
    lens = jnp.full((B,), start, jnp.int32) if circular and SL else None
    ys, t = [], 0
    for c in chunks:
        y, state = jcc.causal_conv1d_update(x[:, :, t:t + c], state, w, activation="silu",
                                            cache_seqlens=lens)
        ys.append(y)
        if lens is not None:
            lens = lens + c
        t += c
    want = reference.causal_conv1d(x, w, activation="silu")
    close(jnp.concatenate(ys, -1), want, jnp.float32, 10)
    _passed("decode")
