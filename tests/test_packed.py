"""Packed sequences (seq_idx): the equality mask, padding, initial states for
the row's first sequence, final states of its last one, and gradients that
follow the same masks. Every case is checked against the independent numpy
loops of oracle.py AND the reference, on the FFI kernels (CPU here, CUDA on a
GPU machine through test_gpu.py), in both layouts; gradients numerically in
float64."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_causal_conv as jcc
from jax_causal_conv import reference

import oracle
from helpers import close, rand, to_np

# Each row a pattern of ids (-1: padding). The table names what it covers.
EDGE_ROWS = {
    "padded_tail": [0, 0, 0, 1, 1, 1, -1, -1],
    "padding_in_middle": [0, 0, 0, -1, -1, 1, 1, 1],
    "not_increasing": [2, 2, 0, 0, 0, 1, 1, 1],
    "id_returns": [0, 0, 1, 1, 0, 0, 0, 1],
    "one_token_start": [5, 0, 0, 0, 0, 0, 0, 0],
    "one_token_middle": [0, 0, 0, 0, 7, 1, 1, 1],
    "one_token_end": [0, 0, 0, 0, 0, 0, 0, 9],
    "all_distinct": [0, 1, 2, 3, 4, 5, 6, 7],
    "all_padding": [-1, -1, -1, -1, -1, -1, -1, -1],
    "padding_first": [-1, -1, 0, 0, 0, 0, 1, 1],
    "short_first_segment": [3, 4, 4, 4, 4, 4, 4, 4],
    "negative_ids_differ": [-1, -2, 0, 0, -3, 1, 1, -1],
}


def _ids(name, B):
    row = np.asarray(EDGE_ROWS[name], np.int32)
    other = np.asarray(EDGE_ROWS["padded_tail"], np.int32)
    return jnp.asarray(np.stack([row] + [other] * (B - 1)))


def _t(cl):
    return (lambda a: None if a is None else jnp.swapaxes(a, 1, 2)) if cl else (lambda a: a)


def _call(fn, x, w, b, r, s, h, act, cl, **kw):
    t = _t(cl)
    y, f = fn(t(x), w, b, activation=act, residual=t(r), seq_idx=s, initial_states=t(h),
              return_final_states=True, channels_last=cl, **kw)
    return t(y), t(f)


def _inputs(rng, B, D, L, W, dtype, bias, residual, states):
    x = rand(rng, (B, D, L), dtype)
    w = rand(rng, (D, W), jnp.float32, 0.5)
    b = rand(rng, (D,), jnp.float32) if bias else None
    r = rand(rng, (B, D, L), dtype) if residual else None
    h = rand(rng, (B, D, W - 1), dtype) if states else None
    return x, w, b, r, h


def _check_forward(x, w, b, r, s, h, act, cl, dtype):
    y, f = _call(jcc.causal_conv1d, x, w, b, r, s, h, act, cl, backend="ffi")
    yr, fr = _call(reference.causal_conv1d, x, w, b, r, s, h, act, cl)
    yo, fo = oracle.conv(to_np(x), to_np(w), to_np(b), act, to_np(r), np.asarray(s), to_np(h))
    close(y, yr, dtype)
    close(y, yo, dtype, 1.0 + np.abs(yo).max(initial=0.0))
    # final states are copies of inputs: exact
    np.testing.assert_array_equal(np.asarray(f, np.float64), fo.astype(np.asarray(f).dtype))
    np.testing.assert_array_equal(np.asarray(f, np.float64), np.asarray(fr, np.float64))
    return y, yo


@pytest.mark.parametrize("name", sorted(EDGE_ROWS))
@pytest.mark.parametrize("W", [2, 4, 5])
@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("states", [False, True])
def test_edge_table_forward(name, W, cl, states):
    rng = np.random.default_rng(W + 10 * cl + 100 * states)
    s = _ids(name, 2)
    x, w, b, r, h = _inputs(rng, 2, 6, 8, W, jnp.float32, True, True, states)
    y, yo = _check_forward(x, w, b, r, s, h, "silu", cl, jnp.float32)
    # padding outputs are exactly the residual
    pad = np.asarray(s) < 0
    np.testing.assert_array_equal(np.asarray(y)[np.broadcast_to(pad[:, None, :], y.shape)],
                                  np.asarray(r)[np.broadcast_to(pad[:, None, :], y.shape)])


@pytest.mark.on_cpu
@pytest.mark.parametrize("name", sorted(EDGE_ROWS))
@pytest.mark.parametrize("cl", [False, True])
def test_edge_table_gradients_float64(name, cl):
    rng = np.random.default_rng(3)
    W = 4
    s = _ids(name, 2)
    x, w, b, r, h = _inputs(rng, 2, 3, 8, W, jnp.float64, True, True, True)
    w, b = w.astype(jnp.float64), b.astype(jnp.float64)  # finite differences need float64
    t = _t(cl)

    def f(x, w, b, r, h):
        y, fin = jcc.causal_conv1d(t(x), w, b, activation="silu", residual=t(r), seq_idx=s,
                                   initial_states=t(h), return_final_states=True,
                                   channels_last=cl, backend="ffi")
        return y, fin

    check_grads(f, (x, w, b, r, h), order=1, modes=["rev"])
    # and equal to the reference's autodiff
    g = rand(rng, (2, 3, 8), jnp.float64)
    gf = rand(rng, (2, 3, W - 1), jnp.float64)

    def loss(fn):
        def run(x, w, b, r, h):
            y, fin = fn(t(x), w, b, activation="silu", residual=t(r), seq_idx=s,
                        initial_states=t(h), return_final_states=True, channels_last=cl)
            return jnp.sum(t(y) * g) + jnp.sum(t(fin) * gf)
        return run
    ours = jax.grad(loss(lambda *a, **k: jcc.causal_conv1d(*a, backend="ffi", **k)),
                    argnums=(0, 1, 2, 3, 4))(x, w, b, r, h)
    ref = jax.grad(loss(reference.causal_conv1d), argnums=(0, 1, 2, 3, 4))(x, w, b, r, h)
    for a, e in zip(ours, ref):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-10, atol=1e-10)


@pytest.mark.on_cpu  # (float64)
def test_gradients_follow_the_masks():
    """Nothing flows through padding, d(initial_states) only from the first sequence."""
    rng = np.random.default_rng(0)
    W = 4
    s = jnp.asarray([[0, 0, 1, 1, 1, 1, -1, -1]], jnp.int32)
    x, w, b, _, h = _inputs(rng, 1, 3, 8, W, jnp.float64, True, False, True)
    w, b = w.astype(jnp.float64), b.astype(jnp.float64)

    def f(x, h):
        return jcc.causal_conv1d(x, w, b, seq_idx=s, initial_states=h, backend="ffi")

    # an output of the second sequence does not depend on the initial state
    jac_h = jax.jacrev(lambda h: f(x, h)[0, :, 3])(h)
    assert np.all(np.asarray(jac_h) == 0)
    # nor on any input of the first sequence
    jac_x = jax.jacrev(lambda x: f(x, h)[0, :, 3])(x)
    assert np.all(np.asarray(jac_x)[..., :2] == 0)
    # padding inputs feed nothing; padding outputs depend on nothing
    jac_all = jax.jacrev(lambda x: f(x, h))(x)
    assert np.all(np.asarray(jac_all)[..., 6:] == 0)
    assert np.all(np.asarray(jac_all)[:, :, 6:] == 0)
    # the first sequence's outputs do read the initial state
    assert np.any(np.asarray(jax.jacrev(lambda h: f(x, h)[0, :, 0])(h)) != 0)


@pytest.mark.on_cpu  # (float64)
@pytest.mark.parametrize("backend", ["ffi", "xla"])
@pytest.mark.parametrize("W", [1, 4, 17])
@pytest.mark.parametrize("cl", [False, True])
def test_nonfinite_padding_reaches_nothing(backend, W, cl):
    """An Inf or NaN in the padding's inputs (uninitialized padding, say)
    changes no output and no gradient: with it and with zeros there, the
    values and the gradients of x, weight, bias and the initial states are
    the same, and finite (the XLA path once masked the products, not the
    inputs, and its weight gradient turned NaN)."""
    rng = np.random.default_rng(W + 10 * cl)
    B, D, L = 2, 5, 90
    ids = np.zeros((B, L), np.int32)
    ids[:, 30:] = 1
    ids[:, 40:47] = -1  # padding in the middle
    ids[:, 47:] = 2
    ids[:, -9:] = np.iinfo(np.int32).min  # and at the tail (any negative id is padding)
    ids[1, :6] = -1    # and leading
    x, w, b, _, h = _inputs(rng, B, D, L, W, jnp.float64, True, False, True)
    w, b = w.astype(jnp.float64), b.astype(jnp.float64)
    if cl:
        x, h = jnp.swapaxes(x, 1, 2), jnp.swapaxes(h, 1, 2)
    pad = np.broadcast_to((ids < 0)[:, :, None] if cl else (ids < 0)[:, None, :], x.shape)
    bad = np.where(pad, np.where(np.arange(pad.size).reshape(pad.shape) % 2, np.inf, np.nan), np.asarray(x))
    zero = np.where(pad, 0.0, np.asarray(x))
    s = jnp.asarray(ids)
    g = jnp.asarray(rng.standard_normal(x.shape))

    def loss(x, w, b, h):
        y = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=s, initial_states=h if W > 1 else None,
                              channels_last=cl, backend=backend)
        return jnp.sum(y * g)

    got = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(jnp.asarray(bad), w, b, h)
    want = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(jnp.asarray(zero), w, b, h)
    for a, e in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.isfinite(np.asarray(a)).all()
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-12, atol=1e-12)


def _random_ids(rng, B, L, pad_tail, pad_middle, increasing):
    ids = rng.integers(0, 4, (B, L))
    if increasing:
        ids = np.sort(ids, axis=1)
    if pad_middle and L > 4:
        ids[:, L // 3 : L // 3 + 2] = -1
    if pad_tail:
        ids[:, L - max(1, L // 5):] = -1
    return jnp.asarray(ids, jnp.int32)


@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 8, 17])
@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16",
                                   pytest.param("float64", marks=pytest.mark.on_cpu)])
def test_random_patterns_against_oracle(W, cl, dtype):
    dt = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float64": jnp.float64}[dtype]
    rng = np.random.default_rng(W * 7 + cl)
    for i, (L, states) in enumerate(itertools.product([1, 5, 40, 301], [False, True])):
        s = _random_ids(rng, 3, L, i % 2 == 0, i % 3 == 0, i % 4 != 0)
        x, w, b, r, h = _inputs(rng, 3, 5, L, W, dt, i % 2 == 1, i % 3 == 1, states)
        _check_forward(x, w, b, r, s, h, ["silu", None][i % 2], cl, dt)


def test_eager_and_jit_agree_for_unordered_ids_and_padding():
    """No value checks that differ between eager and jit."""
    rng = np.random.default_rng(1)
    s = jnp.asarray([[0, 0, 0, 1, 1, 1, -1, -1], [3, 3, 1, 1, 2, 2, 2, 2]], jnp.int32)
    x, w, b, r, h = _inputs(rng, 2, 4, 8, 4, jnp.float32, True, True, True)

    def f(x, s, h):
        return jcc.causal_conv1d(x, w, b, seq_idx=s, initial_states=h, return_final_states=True,
                                 residual=r)
    eager = f(x, s, h)
    jitted = jax.jit(f)(x, s, h)
    for a, e in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
    yo, fo = oracle.conv(to_np(x), to_np(w), to_np(b), None, to_np(r), np.asarray(s), to_np(h))
    close(eager[0], yo, jnp.float32, 10)
    close(eager[1], fo, jnp.float32)


def test_chunked_prefill_of_packed_rows_equals_one_shot():
    """Initial states in, final states out: two chunks of packed rows give the
    one-shot result, with the last sequence of chunk 1 continuing in chunk 2."""
    rng = np.random.default_rng(2)
    W, L = 4, 24
    ids = np.asarray([[0] * 7 + [1] * 9 + [2] * 8, [0] * 12 + [1] * 10 + [-1] * 2], np.int32)
    x, w, b, _, _ = _inputs(rng, 2, 6, L, W, jnp.float32, True, False, False)
    want = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=jnp.asarray(ids))
    cut = 13  # inside sequence 1 of row 0 and inside sequence 1... of row 1: mid-sequence cuts
    y1, f1 = jcc.causal_conv1d(x[..., :cut], w, b, activation="silu",
                               seq_idx=jnp.asarray(ids[:, :cut]), return_final_states=True)
    y2 = jcc.causal_conv1d(x[..., cut:], w, b, activation="silu",
                           seq_idx=jnp.asarray(ids[:, cut:]), initial_states=f1)
    close(jnp.concatenate([y1, y2], -1), want, jnp.float32)


def test_final_states_end_at_the_last_valid_token():
    rng = np.random.default_rng(4)
    W = 4
    s = jnp.asarray([[0, 0, 1, 1, 1, 1, -1, -1], [0, 0, 0, 0, 0, 1, 1, -1]], jnp.int32)
    x, w, _, _, h = _inputs(rng, 2, 3, 8, W, jnp.float32, False, False, True)
    _, f = jcc.causal_conv1d(x, w, seq_idx=s, initial_states=h, return_final_states=True)
    xs = np.asarray(x)
    np.testing.assert_array_equal(np.asarray(f[0]), xs[0, :, 3:6])        # 3 of sequence 1
    np.testing.assert_array_equal(np.asarray(f[1]), np.concatenate(       # 2 of sequence 1, one 0
        [np.zeros((3, 1)), xs[1, :, 5:7]], axis=1))


def test_nested_vmap_of_weight_and_bias_under_grad():
    """Both vmap levels map weight and bias: one custom call, and the gradient
    of every argument equals the reference's."""
    rng = np.random.default_rng(5)
    n1, n2, B, D, L, W = 2, 3, 2, 4, 9, 3
    x = rand(rng, (n1, n2, B, D, L))
    w = rand(rng, (n1, n2, D, W))
    b = rand(rng, (n1, n2, D))
    s = jnp.asarray(np.tile(np.asarray([0, 0, 1, 1, 1, -1, 2, 2, 2], np.int32), (B, 1)))

    def make(fn):
        def one(x, w, b):
            return fn(x, w, b, activation="silu", seq_idx=s)
        return lambda x, w, b: jnp.sum(jax.vmap(jax.vmap(one))(x, w, b) ** 2)

    ours = jax.grad(make(lambda *a, **k: jcc.causal_conv1d(*a, backend="ffi", **k)),
                    argnums=(0, 1, 2))
    ref = jax.grad(make(reference.causal_conv1d), argnums=(0, 1, 2))
    for a, e in zip(ours(x, w, b), ref(x, w, b)):
        close(a, e, jnp.float32, 10)
    hlo = jax.jit(ours).lower(x, w, b).as_text()
    assert hlo.count("jax_causal_conv_bwd") == 1 and hlo.count("jax_causal_conv_fwd") == 1


def test_nested_vmap_of_update_weight_and_bias_under_grad_of_inputs():
    """The update's vmap rule with weight and bias mapped at both levels."""
    rng = np.random.default_rng(6)
    n1, n2, B, D, W = 2, 2, 3, 4, 4
    x = rand(rng, (n1, n2, B, D, 2))
    st = rand(rng, (n1, n2, B, D, W - 1))
    w = rand(rng, (n1, n2, D, W))
    b = rand(rng, (n1, n2, D))

    def make(fn):
        def one(x, st, w, b):
            return fn(x, st, w, b, activation="silu")
        return jax.vmap(jax.vmap(one))

    y, s2 = make(jcc.causal_conv1d_update)(x, st, w, b)
    yr, sr = make(reference.causal_conv1d_update)(x, st, w, b)
    close(y, yr, jnp.float32)
    np.testing.assert_array_equal(np.asarray(s2), np.asarray(sr))
    hlo = jax.jit(make(jcc.causal_conv1d_update)).lower(x, st, w, b).as_text()
    assert hlo.count("custom_call_target=\"jax_causal_conv_update") + hlo.count(
        "custom_call @jax_causal_conv_update") == 1
