"""Flax wrappers (linen and nnx): module == functional reference, decode == full,
and the usual transformations (jit, grad, vmap, scan over stacked layers)."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import jax_causal_conv as jcc  # noqa: E402
from jax_causal_conv import reference  # noqa: E402
from jax_causal_conv.flax import CausalConv1d  # noqa: E402
from jax_causal_conv.nnx import CausalConv1d as NnxCausalConv1d  # noqa: E402
from flax_support import scanned_stack  # noqa: E402

B, L, D = 2, 13, 8
normal_bias = nn.initializers.normal(0.5)


def _x(seed=0, shape=(B, L, D)):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _np_conv(x, w, b, silu):
    """Independent numpy formula over (B, L, D): y[t] = b + sum_k w[:, k] x[t-(W-1)+k]."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    W = w.shape[1]
    xp = np.concatenate([np.zeros((x.shape[0], W - 1, x.shape[2])), x], axis=1)
    y = sum(w[:, k] * xp[:, k:k + x.shape[1]] for k in range(W)) + np.asarray(b, np.float64)
    return y / (1 + np.exp(-y)) if silu else y


# --------------------------------------------------------------------------- linen


@pytest.mark.parametrize("activation", [None, "silu"])
def test_linen_matches_formula(activation):
    x = _x()
    m = CausalConv1d(D, kernel_size=4, activation=activation, bias_init=normal_bias)
    v = m.init(jax.random.key(1), x)
    p = v["params"]
    assert p["kernel"].shape == (D, 4) and p["bias"].shape == (D,)
    y = m.apply(v, x)
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_allclose(y, _np_conv(x, p["kernel"], p["bias"], activation == "silu"),
                               rtol=1e-5, atol=1e-5)
    ref = reference.causal_conv1d(x, p["kernel"], p["bias"], activation=activation,
                                  channels_last=True)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)


def test_linen_residual_no_bias_and_dtypes():
    x, r = _x(0), _x(1)
    m = CausalConv1d(D, kernel_size=3, use_bias=False, activation="silu")
    v = m.init(jax.random.key(2), x)
    assert "bias" not in v["params"]
    y = m.apply(v, x, r)
    ref = reference.causal_conv1d(x, v["params"]["kernel"], activation="silu", residual=r,
                                  channels_last=True)
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-6)
    # param_dtype / dtype
    mb = CausalConv1d(D, kernel_size=3, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    vb = mb.init(jax.random.key(2), x)
    assert vb["params"]["kernel"].dtype == jnp.bfloat16
    yb = mb.apply(vb, x)
    assert yb.dtype == jnp.bfloat16
    ref = reference.causal_conv1d(x.astype(jnp.bfloat16), vb["params"]["kernel"],
                                  vb["params"]["bias"], channels_last=True)
    np.testing.assert_allclose(np.float32(yb), np.float32(ref), rtol=2e-2, atol=2e-2)


def test_default_kernel_init_is_fan_in_scaled():
    W, Dbig = 4, 4096
    v = CausalConv1d(Dbig, kernel_size=W).init(jax.random.key(0), jnp.zeros((1, 2, Dbig)))
    k = np.asarray(v["params"]["kernel"])
    assert abs(k.std() - 1 / np.sqrt(W)) < 0.05 / np.sqrt(W)
    assert np.all(np.asarray(v["params"]["bias"]) == 0)


def _linen_decode(m, params, x, chunks):
    cache = m.init(jax.random.key(0), x, decode=True)["cache"]
    assert cache["conv_state"].shape == (x.shape[0], m.kernel_size - 1, D)
    assert not np.any(np.asarray(cache["conv_state"]))
    outs, t = [], 0
    step = jax.jit(lambda p, c, xc: m.apply({"params": p, "cache": c}, xc, decode=True,
                                            mutable=["cache"]))
    for n in chunks:
        y, mut = step(params, cache, x[:, t:t + n])
        cache, t = mut["cache"], t + n
        outs.append(y)
    assert t == x.shape[1]
    return jnp.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("W,chunks", [(4, [1] * L), (4, [5, 1, 1, 3, 1, 2]), (2, [1] * L),
                                      (1, [4, 1] + [1] * 8),
                                      (6, [2, 1, 7, 3])])
def test_linen_decode_equals_full(W, chunks):
    x = _x(3)
    m = CausalConv1d(D, kernel_size=W, activation="silu", bias_init=normal_bias)
    params = m.init(jax.random.key(1), x)["params"]
    full = m.apply({"params": params}, x)
    got, cache = _linen_decode(m, params, x, chunks)
    np.testing.assert_allclose(got, full, rtol=1e-6, atol=1e-6)
    # the cache holds the last W-1 inputs
    np.testing.assert_array_equal(cache["conv_state"], x[:, L - (W - 1):] if W > 1
                                  else x[:, :0])


def test_linen_decode_without_init_creates_cache():
    x = _x(4)
    m = CausalConv1d(D, kernel_size=4)
    params = m.init(jax.random.key(1), x)["params"]
    y, mut = m.apply({"params": params}, x[:, :6], decode=True, mutable=["cache"])
    y2, _ = m.apply({"params": params, **mut}, x[:, 6:], decode=True, mutable=["cache"])
    np.testing.assert_allclose(jnp.concatenate([y, y2], 1), m.apply({"params": params}, x),
                               rtol=1e-6, atol=1e-6)


def test_linen_grad_matches_reference():
    x, r = _x(5), _x(6)
    m = CausalConv1d(D, kernel_size=4, activation="silu", bias_init=normal_bias)
    params = m.init(jax.random.key(1), x)["params"]
    cot = _x(7)

    def loss_mod(p, x, r):
        return jnp.sum(m.apply({"params": p}, x, r) * cot)

    def loss_ref(p, x, r):
        return jnp.sum(reference.causal_conv1d(x, p["kernel"], p["bias"], activation="silu",
                                               residual=r, channels_last=True) * cot)

    g = jax.jit(jax.grad(loss_mod, argnums=(0, 1, 2)))(params, x, r)
    gr = jax.grad(loss_ref, argnums=(0, 1, 2))(params, x, r)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(gr)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_linen_vmap_over_inputs_and_params():
    xs = _x(8, (3, B, L, D))
    m = CausalConv1d(D, kernel_size=4, bias_init=normal_bias)
    params = jax.vmap(lambda k: m.init(k, xs[0])["params"])(jax.random.split(jax.random.key(0), 3))
    ys = jax.jit(jax.vmap(lambda p, x: m.apply({"params": p}, x)))(params, xs)
    for i in range(3):
        ref = reference.causal_conv1d(xs[i], params["kernel"][i], params["bias"][i],
                                      channels_last=True)
        np.testing.assert_allclose(ys[i], ref, rtol=1e-6, atol=1e-6)


class _Block(nn.Module):
    width: int = 4

    @nn.compact
    def __call__(self, x, decode=False):
        y = CausalConv1d(D, kernel_size=self.width, activation="silu", bias_init=normal_bias,
                         name="conv")(x, x, decode=decode)
        return y, None


class _Stack(nn.Module):
    n: int = 3

    @nn.compact
    def __call__(self, x, decode=False):
        Scan = nn.scan(_Block, variable_axes={"params": 0, "cache": 0},
                       split_rngs={"params": True}, in_axes=nn.broadcast, length=self.n)
        x, _ = Scan(name="layers")(x, decode)
        return x


def test_linen_scan_over_stacked_layers_and_decode():
    x = _x(9)
    m = _Stack()
    params = m.init(jax.random.key(0), x)["params"]
    k, b = params["layers"]["conv"]["kernel"], params["layers"]["conv"]["bias"]
    assert k.shape == (3, D, 4)
    h = x
    for i in range(3):
        h = reference.causal_conv1d(h, k[i], b[i], activation="silu", residual=h,
                                    channels_last=True)
    full = jax.jit(lambda p, x: m.apply({"params": p}, x))(params, x)
    np.testing.assert_allclose(full, h, rtol=1e-5, atol=1e-5)
    cache = m.init(jax.random.key(0), x, decode=True)["cache"]
    assert cache["layers"]["conv"]["conv_state"].shape == (3, B, 3, D)
    step = jax.jit(lambda p, c, xc: m.apply({"params": p, "cache": c}, xc, True,
                                            mutable=["cache"]))
    outs, t = [], 0
    for n in [4, 1, 1, 2, 1, 4]:
        y, mut = step(params, cache, x[:, t:t + n])
        cache, t = mut["cache"], t + n
        outs.append(y)
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- nnx


def _nnx(W=4, activation="silu", **kw):
    return NnxCausalConv1d(D, W, activation=activation, bias_init=normal_bias,
                           rngs=nnx.Rngs(0), **kw)


def test_nnx_matches_reference_and_residual():
    x, r = _x(10), _x(11)
    m = _nnx()
    assert m.kernel.shape == (D, 4) and m.bias.shape == (D,)
    k, b = np.asarray(m.kernel), np.asarray(m.bias)
    np.testing.assert_allclose(m(x), _np_conv(x, k, b, True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m(x, r), reference.causal_conv1d(
        x, k, b, activation="silu", residual=r, channels_last=True), rtol=1e-6, atol=1e-6)
    m0 = NnxCausalConv1d(D, 3, use_bias=False, rngs=nnx.Rngs(0))
    assert m0.bias is None
    np.testing.assert_allclose(m0(x), reference.causal_conv1d(
        x, np.asarray(m0.kernel), channels_last=True), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("W,chunks", [(4, [1] * L), (4, [6, 2, 1, 1, 3]),
                                      (1, [3] + [1] * 10)])
def test_nnx_decode_equals_full(W, chunks):
    x = _x(12)
    m = _nnx(W)
    full = m(x)
    with pytest.raises(ValueError, match="init_cache"):
        m(x[:, :1], decode=True)
    m.init_cache(B)
    assert m.cache.shape == (B, W - 1, D)

    @nnx.jit
    def step(m, xc):
        return m(xc, decode=True)

    outs, t = [], 0
    for n in chunks:
        outs.append(step(m, x[:, t:t + n]))
        t += n
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, rtol=1e-6, atol=1e-6)
    if W > 1:
        np.testing.assert_array_equal(m.cache, x[:, L - (W - 1):])


def test_nnx_grad_and_vmap():
    x, cot = _x(13), _x(14)
    m = _nnx()

    @nnx.jit
    def grads(m, x):
        return nnx.grad(lambda m: jnp.sum(m(x) * cot))(m)

    g = grads(m, x)
    k, b = jnp.asarray(m.kernel), jnp.asarray(m.bias)
    gk, gb = jax.grad(lambda k, b: jnp.sum(reference.causal_conv1d(
        x, k, b, activation="silu", channels_last=True) * cot), argnums=(0, 1))(k, b)
    np.testing.assert_allclose(g.kernel, gk, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.bias, gb, rtol=1e-5, atol=1e-5)
    xs = _x(15, (3, B, L, D))
    ys = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(m, xs)
    for i in range(3):
        np.testing.assert_allclose(ys[i], m(xs[i]), rtol=1e-6, atol=1e-6)


def test_nnx_scan_over_stacked_layers_and_decode():
    n = 3
    x = _x(16)

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return NnxCausalConv1d(D, 4, activation="silu", bias_init=normal_bias,
                               rngs=nnx.Rngs(key))

    layers = make(jax.random.split(jax.random.key(0), n))
    assert layers.kernel.shape == (n, D, 4)

    forward = scanned_stack()

    full = forward(layers, x)
    k, b = np.asarray(layers.kernel), np.asarray(layers.bias)
    h = x
    for i in range(n):
        h = reference.causal_conv1d(h, k[i], b[i], activation="silu", residual=h,
                                    channels_last=True)
    np.testing.assert_allclose(full, h, rtol=1e-5, atol=1e-5)

    nnx.vmap(lambda l: l.init_cache(B), in_axes=0)(layers)
    assert layers.cache.shape == (n, B, 3, D)
    outs, t = [], 0
    for c in [5, 1, 1, 4, 2]:
        outs.append(forward(layers, x[:, t:t + c], decode=True))
        t += c
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_package_import_does_not_need_flax(tmp_path):
    import os
    import subprocess
    import sys
    # the package under test (installed, or the source tree in development), run
    # from elsewhere so the source tree does not shadow an installed build
    pkg_parent = os.path.dirname(os.path.dirname(jcc.__file__))
    code = ("import sys, jax_causal_conv, jax_causal_conv.__main__; "
            "assert 'flax' not in sys.modules and 'optax' not in sys.modules, 'flax imported'")
    env = dict(os.environ, PYTHONPATH=pkg_parent, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
