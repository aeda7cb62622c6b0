"""Property tests (hypothesis): every entry point against the reference over
random shapes, widths, dtypes, layouts, seq_idx patterns, states, varlen splits
and decode schedules.

A short profile runs in CI; the long one (>= 10,000 examples per property) runs
on demand:  JCC_HYPOTHESIS_PROFILE=long pytest tests/test_properties.py
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import jax_causal_conv as jcc  # noqa: E402
from jax_causal_conv import reference  # noqa: E402

import oracle  # noqa: E402
from helpers import close, float64_on_cpu  # noqa: E402

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
@float64_on_cpu
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


@given(runs=st.lists(st.tuples(st.integers(1, 6), st.integers(-3, 4)), min_size=1, max_size=8),
       B=st.sampled_from([1, 2]), D=st.sampled_from([1, 6]), W=st.sampled_from([1, 2, 3, 4, 5]),
       dtype=st.sampled_from([jnp.float32, jnp.float64]), cl=st.booleans(), states=st.booleans(),
       act=st.sampled_from([None, "silu"]), residual=st.booleans(), seed=st.integers(0, 2**31))
@float64_on_cpu
def test_packed_property(runs, B, D, W, dtype, cl, states, act, residual, seed):
    """Random seq_idx patterns: runs of ids that need not increase, may
    return, and may be padding (negative, several different values), with
    initial states for the row's first segment and final states of its last
    one: the kernel against the reference and the float64 numpy loops of
    tests/oracle.py; in float64 also every gradient against the reference's."""
    row = np.concatenate([np.full(n, v, np.int32) for n, v in runs])
    ids = np.stack([row, row[::-1]][:B])  # the second row: the runs reversed
    L = ids.shape[1]
    t = (lambda a: jnp.swapaxes(a, 1, 2)) if cl else (lambda a: a)
    x = _arr(seed, (B, D, L), dtype)
    w = _arr(seed + 1, (D, W), jnp.float32)
    b = _arr(seed + 2, (D,), jnp.float32)
    r = _arr(seed + 3, (B, D, L), dtype) if residual else None
    h = _arr(seed + 4, (B, D, W - 1), dtype) if states else None
    s = jnp.asarray(ids)

    def conv(impl, x, w, b, r, h):
        y, f = impl(t(x), w, b, activation=act, residual=None if r is None else t(r), seq_idx=s,
                    initial_states=None if h is None else t(h), return_final_states=True, channels_last=cl)
        return t(y), t(f)

    ours = lambda *a: conv(lambda *p, **k: jcc.causal_conv1d(*p, backend="ffi", **k), *a)  # noqa: E731
    y, f = ours(x, w, b, r, h)
    yr, fr = conv(reference.causal_conv1d, x, w, b, r, h)
    yo, fo = oracle.conv(x, w, b, act, r, ids, h)
    scale = 1 + float(np.abs(yo).max())
    for got, want in ((y, yr), (y, yo), (f, fr), (f, fo)):
        close(got, jnp.asarray(want, dtype), dtype, scale)
    if dtype == jnp.float64:  # gradients of every input
        args = (x, w.astype(dtype), b.astype(dtype), r, h)
        cot = _arr(seed + 5, (B, D, L), dtype), _arr(seed + 6, (B, D, W - 1), dtype)
        loss = lambda impl: lambda *a: sum(jnp.sum(o * c) for o, c in zip(impl(*a), cot))  # noqa: E731
        nums = tuple(i for i, a in enumerate(args) if a is not None)
        g = jax.grad(loss(ours), nums)(*args)
        gr = jax.grad(loss(lambda *a: conv(reference.causal_conv1d, *a)), nums)(*args)
        for got, want in zip(g, gr):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9)
    _passed("packed")


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
