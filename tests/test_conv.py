"""causal_conv1d: the FFI kernels against the reference, a numpy loop and
lax.conv_general_dilated, across dtypes, widths, layouts, options and sizes."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import jax_causal_conv as jcc
from jax_causal_conv import reference

import oracle
from helpers import DTYPES, close, forward_v1, rand, seq_idx, to_np

WIDTHS = [1, 2, 3, 4, 5, 8, 33]
SIZES = [(2, 5, 37), (1, 1, 1), (3, 8, 2), (2, 17, 300), (1, 33, 9), (2, 24, 600)]
MODES = ["plain", "seq_idx", "states"]


def _cases():
    """dtype x width x layout in full; the other options rotate through their values."""
    for i, (dt, W, cl) in enumerate(itertools.product(DTYPES, WIDTHS, [False, True])):
        yield pytest.param(dt, W, cl, bool(i % 2), ["silu", None][i // 2 % 2], MODES[i % 3],
                           bool(i // 3 % 2), SIZES[i % len(SIZES)],
                           id=f"{dt}-W{W}-{'cl' if cl else 'cf'}-{i}",
                           marks=pytest.mark.on_cpu if dt == "float64" else ())


def _inputs(rng, dtype, W, cl, bias, mode, residual, size):
    B, D, L = size
    x = rand(rng, (B, D, L), dtype)
    w = rand(rng, (D, W), jnp.float32, 0.5)
    b = rand(rng, (D,), jnp.float32) if bias else None
    r = rand(rng, (B, D, L), dtype) if residual else None
    s = seq_idx(rng, B, L) if mode == "seq_idx" else None
    h = rand(rng, (B, D, W - 1), dtype) if mode == "states" else None
    return x, w, b, r, s, h


def _run(fn, x, w, b, r, s, h, act, cl, **kw):
    t = (lambda a: None if a is None else jnp.swapaxes(a, 1, 2)) if cl else (lambda a: a)
    y, f = fn(t(x), w, b, activation=act, residual=t(r), seq_idx=s, initial_states=t(h),
              return_final_states=True, channels_last=cl, **kw)
    return t(y), t(f)


@pytest.mark.parametrize("dtype,W,cl,bias,act,mode,residual,size", _cases())
def test_forward_matches_reference_and_numpy(dtype, W, cl, bias, act, mode, residual, size):
    rng = np.random.default_rng(W * 100 + size[2])
    x, w, b, r, s, h = _inputs(rng, DTYPES[dtype], W, cl, bias, mode, residual, size)
    y, f = _run(jcc.causal_conv1d, x, w, b, r, s, h, act, cl, backend="ffi")
    yr, fr = _run(reference.causal_conv1d, x, w, b, r, s, h, act, cl)
    yo, fo = oracle.conv(to_np(x), to_np(w), to_np(b), act, to_np(r),
                         None if s is None else np.asarray(s), to_np(h))
    assert y.dtype == x.dtype and f.dtype == x.dtype
    assert y.shape == x.shape and f.shape == (size[0], size[1], W - 1)
    close(y, yr, x.dtype)
    close(f, fr, x.dtype)
    scale = 1.0 + np.abs(yo).max(initial=0.0)
    close(y, yo, x.dtype, scale)
    np.testing.assert_array_equal(np.asarray(f, np.float64), fo.astype(np.asarray(f).dtype))


@pytest.mark.parametrize("bias,act,mode,residual,cl",
                         list(itertools.product([False, True], [None, "silu"], MODES,
                                                [False, True], [False, True])))
def test_forward_every_option_combination(bias, act, mode, residual, cl):
    rng = np.random.default_rng(7)
    x, w, b, r, s, h = _inputs(rng, jnp.float32, 4, cl, bias, mode, residual, (2, 19, 53))
    y, f = _run(jcc.causal_conv1d, x, w, b, r, s, h, act, cl, backend="ffi")
    yo, fo = oracle.conv(to_np(x), to_np(w), to_np(b), act, to_np(r),
                         None if s is None else np.asarray(s), to_np(h))
    close(y, yo, jnp.float32, 10)
    close(f, fo, jnp.float32)


@pytest.mark.parametrize("W", [1, 2, 4, 7])
def test_matches_lax_conv_general_dilated(W):
    rng = np.random.default_rng(W)
    B, D, L = 3, 12, 41
    x, w, b = rand(rng, (B, D, L)), rand(rng, (D, W)), rand(rng, (D,))
    want = lax.conv_general_dilated(x, w[:, None, :], (1,), [(W - 1, 0)],
                                    feature_group_count=D,
                                    precision=lax.Precision.HIGHEST) + b[:, None]
    close(jcc.causal_conv1d(x, w, b, backend="ffi"), want, jnp.float32, 10)


@pytest.mark.parametrize("wdtype", ["float16", "bfloat16", "float64"])
def test_weight_dtype_may_differ_from_x(wdtype):
    rng = np.random.default_rng(3)
    x = rand(rng, (2, 8, 30), jnp.float32)
    w, b = rand(rng, (8, 4), DTYPES[wdtype]), rand(rng, (8,), DTYPES[wdtype])
    y = jcc.causal_conv1d(x, w, b, activation="silu", backend="ffi")
    assert y.dtype == jnp.float32
    close(y, reference.causal_conv1d(x, w, b, activation="silu"), jnp.float32)
    gw = jax.grad(lambda w: jnp.sum(jcc.causal_conv1d(x, w, b, backend="ffi")))(w)
    assert gw.dtype == w.dtype


def test_backends_agree_and_auto_uses_the_kernel():
    # (W = 5: "auto" takes the kernel for this small forward on every
    # platform; at W <= 4 a GPU routes it to XLA, routing.py)
    rng = np.random.default_rng(5)
    x, w = rand(rng, (2, 6, 20)), rand(rng, (6, 5))
    ys = [jcc.causal_conv1d(x, w, activation="swish", backend=be) for be in ("auto", "ffi", "xla")]
    close(ys[0], ys[1], jnp.float32)
    close(ys[0], ys[2], jnp.float32)
    hlo = jax.jit(lambda x, w: jcc.causal_conv1d(x, w)).lower(x, w).as_text()
    assert "custom_call @jax_causal_conv_fwd_v2" in hlo
    assert "convolution" not in hlo


def test_forward_v1_target_computes_what_the_current_one_does():
    # jax_causal_conv_fwd_v1 (no workspace result) stays registered for
    # programs exported before v2; on a GPU it takes the shared-ids seq_idx
    # kernels where v2 may read mask words from its workspace.
    rng = np.random.default_rng(11)
    B, D, L, W = 2, 16, 2048, 4
    x, w, b, h = rand(rng, (B, D, L)), rand(rng, (D, W)), rand(rng, (D,)), rand(rng, (B, D, W - 1))
    s = seq_idx(rng, B, L).at[1, -100:].set(-1)  # a padded tail
    y = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=s, initial_states=h, backend="ffi")
    close(forward_v1(x, w, b, s, h), y, jnp.float32)
    close(y, reference.causal_conv1d(x, w, b, activation="silu", seq_idx=s, initial_states=h), jnp.float32)


def test_empty_dimensions_give_empty_results():
    w = jnp.ones((4, 3))
    for shape in [(0, 4, 5), (2, 4, 0)]:
        y, f = jcc.causal_conv1d(jnp.ones(shape), w, return_final_states=True)
        assert y.shape == shape and f.shape == (shape[0], 4, 2)
    h = jnp.arange(2 * 4 * 2, dtype=jnp.float32).reshape(2, 4, 2)
    _, f = jcc.causal_conv1d(jnp.ones((2, 4, 0)), w, initial_states=h, return_final_states=True)
    np.testing.assert_array_equal(f, h)  # L = 0: the history passes through


@pytest.mark.on_cpu  # (float64)
def test_nan_and_inf_propagate_like_the_reference():
    x = jnp.zeros((1, 2, 8)).at[0, 0, 3].set(jnp.nan).at[0, 1, 5].set(jnp.inf)
    w = jnp.ones((2, 3))
    y, yr = jcc.causal_conv1d(x, w, backend="ffi"), reference.causal_conv1d(x, w)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(yr))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(yr))
    assert np.isnan(y[0, 0, 3:6]).all() and not np.isnan(y[0, 0, :3]).any()


# --- gradients ---------------------------------------------------------------

GRAD_CASES = [  # W, channels_last, act, mode, residual
    (1, False, None, "plain", False),
    (3, False, "silu", "states", True),
    (4, True, "silu", "states", False),
    (4, False, None, "seq_idx", True),
    (8, True, None, "plain", True),
    (5, False, "silu", "seq_idx", False),
]


@pytest.mark.on_cpu
@pytest.mark.parametrize("W,cl,act,mode,residual", GRAD_CASES)
def test_gradients_numerically_float64(W, cl, act, mode, residual):
    rng = np.random.default_rng(W)
    x, w, b, r, s, h = _inputs(rng, jnp.float64, W, cl, True, mode, residual, (2, 3, 11))
    w, b = w.astype(jnp.float64), b.astype(jnp.float64)
    g = rand(rng, x.shape, jnp.float64)
    gf = rand(rng, (2, 3, W - 1), jnp.float64)

    def f(x, w, b, r, h):
        y, fin = _run(jcc.causal_conv1d, x, w, b, r, s, h, act, cl, backend="ffi")
        return jnp.sum(y * g) + jnp.sum(fin * gf)

    args = (x, w, b, r if residual else jnp.zeros_like(x),
            h if h is not None else None)
    if h is None:
        check_grads(lambda x, w, b, r: f(x, w, b, r, None), args[:4], order=1, modes=("rev",))
    else:
        check_grads(f, args, order=1, modes=("rev",))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("cl", [False, True])
def test_gradients_match_reference(dtype, cl):
    rng = np.random.default_rng(11)
    x, w, b, r, _, h = _inputs(rng, DTYPES[dtype], 4, cl, True, "states", True, (2, 16, 130))
    g = rand(rng, x.shape, jnp.float32)

    def loss(fn):
        def f(x, w, b, r, h):
            y, fin = _run(fn, x, w, b, r, None, h, "silu", cl)
            return jnp.sum(y.astype(jnp.float32) * g) + jnp.sum(fin.astype(jnp.float32))
        return jax.grad(f, argnums=(0, 1, 2, 3, 4))

    got = loss(jcc.causal_conv1d)(x, w, b, r, h)
    want = loss(reference.causal_conv1d)(x, w, b, r, h)
    for a, e in zip(got, want):
        assert a.dtype == e.dtype
        close(a, e, a.dtype, 1 + float(np.abs(np.asarray(e, np.float64)).max()))


def test_backward_is_deterministic_and_jit_equals_eager():
    rng = np.random.default_rng(2)
    x, w, b = rand(rng, (4, 40, 700)), rand(rng, (40, 4)), rand(rng, (40,))
    g = rand(rng, x.shape)
    f = jax.grad(lambda x, w, b: jnp.sum(jcc.causal_conv1d(x, w, b, activation="silu") * g),
                 argnums=(0, 1, 2))
    runs = [f(x, w, b) for _ in range(2)] + [jax.jit(f)(x, w, b)]
    for other in runs[1:]:
        for a, e in zip(runs[0], other):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
