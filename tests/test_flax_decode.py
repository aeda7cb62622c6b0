"""Flax decode through the update kernel on a channels-last cache: the ordered
cache (speculative_tokens=0) and the ring (speculative_tokens=K) with accept(),
prefill of any length then (speculative) decoding, for linen and nnx, single
modules and stacked layers; outputs equal the full-sequence ones."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("flax")

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import jax_causal_conv.flax as jflax  # noqa: E402
import jax_causal_conv.nnx as jnnx  # noqa: E402
from jax_causal_conv import _decode_cache  # noqa: E402
from jax_causal_conv._lowering import targets  # noqa: E402
from jax_causal_conv.flax import CausalConv1d  # noqa: E402

import oracle_decode  # noqa: E402
from flax_support import scanned_stack  # noqa: E402

B, D = 3, 8
normal_bias = nn.initializers.normal(0.5)


def _x(seed, T):
    return jax.random.normal(jax.random.key(seed), (B, T, D), jnp.float32)


def _schedule(rng, K, steps, max_step=None):
    """[(S, a (B,))]: S tokens per call, row b keeps a[b] >= S - K of them."""
    out = []
    for _ in range(steps):
        S = int(rng.integers(1, (max_step or K + 1) + 1))
        out.append((S, rng.integers(max(0, S - K), S + 1, B)))
    return out


def _drafts(rng, x_true, p, S, a):
    """(B, S, D): row b's next a[b] true tokens, then garbage."""
    x = np.asarray(rng.standard_normal((B, S, D)) * 3, np.float32)
    for r in range(B):
        x[r, :a[r]] = x_true[r, p[r]:p[r] + a[r]]
    return jnp.asarray(x)


def _run_spec(step, accept, x_true, full, prefill, schedule, rng):
    """Prefill, then the schedule; every accepted output against ``full``."""
    x_true, full = np.asarray(x_true), np.asarray(full)
    y = step(jnp.asarray(x_true[:, :prefill]))
    np.testing.assert_allclose(y, full[:, :prefill], rtol=1e-5, atol=1e-5)
    p = np.full(B, prefill)
    for S, a in schedule:
        y = np.asarray(step(_drafts(rng, x_true, p, S, a)))
        accept(jnp.asarray(a, jnp.int32))
        for r in range(B):
            np.testing.assert_allclose(y[r, :a[r]], full[r, p[r]:p[r] + a[r]], rtol=1e-5,
                                       atol=1e-5)
        p += a
    return p


# --------------------------------------------------------------------------- linen


def _length(seen, step_tokens):
    """A ring cache's stream length: the tokens before the last decode call
    (cache_seqlens) and those of it that are kept (step_tokens)."""
    return np.asarray(seen) + np.asarray(step_tokens)


def _linen(W, K, **kw):
    return CausalConv1d(D, kernel_size=W, activation="silu", bias_init=normal_bias,
                        speculative_tokens=K, **kw)


def _linen_stepper(run, params, cache):
    """step(xs) -> y and accept(n) over a linen model's decode cache, held
    in the returned dict ("cache") between the calls of run(params, cache,
    xs) -> (y, mutated)."""
    state = {"cache": cache}

    def step(xs):
        y, mut = run(params, state["cache"], xs)
        state["cache"] = mut["cache"]
        return y

    def accept(a):
        state["cache"] = jflax.accept(state["cache"], a)
    return step, accept, state


@pytest.mark.parametrize("W,K,prefill", [(4, 3, 5), (4, 3, 23), (4, 1, 1), (2, 4, 2),
                                         (5, 2, 40), (1, 2, 3), (4, 20, 30)])
def test_linen_ring_speculative_decode_equals_full(W, K, prefill):
    rng = np.random.default_rng(W * 10 + K)
    T = 300
    x = _x(W + K, T)
    m = _linen(W, K)
    params = m.init(jax.random.key(1), x)["params"]
    full = m.apply({"params": params}, x)
    cache = m.init(jax.random.key(0), x[:, :1], decode=True)["cache"]
    assert cache["conv_state"].shape == (B, W - 1 + K, D)
    assert cache["cache_seqlens"].shape == (B,) and cache["step_tokens"].dtype == jnp.int32
    step, accept, state = _linen_stepper(jax.jit(lambda p, c, xs: m.apply(
        {"params": p, "cache": c}, xs, decode=True, mutable=["cache"]), donate_argnums=1), params, cache)

    # short steps, a long one mid-stream (the full-convolution path, reading the
    # ring), and a verify step of K+2 tokens keeping 2
    sched = (_schedule(rng, K, 4) + [(18, rng.integers(max(0, 18 - K), 19, B))]
             + _schedule(rng, K, 4) + [(min(K + 2, 20), np.full(B, 2))])
    p = _run_spec(step, accept, x, full, prefill, sched, rng)
    n = _length(state["cache"]["cache_seqlens"], state["cache"]["step_tokens"])
    np.testing.assert_array_equal(n, p)
    # the committed window is the last W-1 accepted inputs
    win = _decode_cache.ring_window(state["cache"]["conv_state"], n, W - 1)
    for r in range(B):
        np.testing.assert_array_equal(win[r], x[r, p[r] - (W - 1):p[r]])


def test_linen_accept_method_and_clipping():
    W, K = 4, 3
    x = _x(5, 12)
    m = _linen(W, K)
    params = m.init(jax.random.key(1), x)["params"]
    full = m.apply({"params": params}, x)
    v = {"params": params, "cache": m.init(jax.random.key(0), x, decode=True)["cache"]}
    _, mut = m.apply(v, x[:, :6], decode=True, mutable=["cache"])
    y, mut = m.apply({"params": params, **mut}, x[:, 6:9], decode=True, mutable=["cache"])
    np.testing.assert_allclose(y, full[:, 6:9], rtol=1e-5, atol=1e-5)
    # keep 1 of the 3 (as a scalar); again (idempotent); more than fed is clipped
    for a in [1, 1]:
        _, mut = m.apply({"params": params, **mut}, a, method=CausalConv1d.accept,
                         mutable=["cache"])
        np.testing.assert_array_equal(_length(mut["cache"]["cache_seqlens"],
                                              mut["cache"]["step_tokens"]), [7] * B)
    y, mut = m.apply({"params": params, **mut}, x[:, 7:10], decode=True, mutable=["cache"])
    np.testing.assert_allclose(y, full[:, 7:10], rtol=1e-5, atol=1e-5)
    c = jflax.accept(mut["cache"], 99)
    np.testing.assert_array_equal(_length(c["cache_seqlens"], c["step_tokens"]), [10] * B)
    c = jflax.accept(mut["cache"], -4)
    np.testing.assert_array_equal(_length(c["cache_seqlens"], c["step_tokens"]), [7] * B)
    m0 = _linen(W, 0)
    v0 = {"params": params, "cache": m0.init(jax.random.key(0), x, decode=True)["cache"]}
    assert set(v0["cache"]) == {"conv_state"}
    with pytest.raises(ValueError, match="speculative_tokens > 0"):
        m0.apply(v0, 1, method=CausalConv1d.accept, mutable=["cache"])
    with pytest.raises(ValueError, match="speculative_tokens"):
        _linen(W, -1).init(jax.random.key(0), x, decode=True)


@pytest.mark.parametrize("K", [0, 3])
def test_linen_short_steps_run_the_update_kernel_in_place(K):
    W = 4
    x = _x(6, 30)
    m = _linen(W, K)
    params = m.init(jax.random.key(1), x)["params"]
    cache = m.init(jax.random.key(0), x, decode=True)["cache"]
    run = jax.jit(lambda p, c, xs: m.apply({"params": p, "cache": c}, xs, decode=True,
                                           mutable=["cache"]), donate_argnums=1)
    for L, kernel in [(1, targets.UPDATE), (4, targets.UPDATE),
                      (_decode_cache.UPDATE_MAX_TOKENS + 1, targets.FORWARD)]:
        hlo = run.lower(params, cache, x[:, :L]).compile().as_text()
        assert kernel in hlo, (L, kernel)
        if kernel == targets.UPDATE:
            assert targets.FORWARD not in hlo and "transpose(" not in hlo
            assert "input_output_alias" in hlo
    # and K = 0 keeps the ordered cache: the last W-1 inputs, as before
    for t in range(0, 30, 3):
        _, mut = run(params, cache, x[:, t:t + 3])
        cache = mut["cache"]
    if K == 0:
        np.testing.assert_array_equal(cache["conv_state"], x[:, 30 - (W - 1):])


@pytest.mark.parametrize("W,chunks", [(4, [20, 1, 1, 17, 2]), (3, [1, 30, 1]),
                                      (1, [18, 2])])
def test_linen_ordered_long_and_short_steps_equal_full(W, chunks):
    x = _x(7, sum(chunks))
    r = _x(8, sum(chunks))
    m = _linen(W, 0)
    params = m.init(jax.random.key(1), x)["params"]
    full = m.apply({"params": params}, x, r)
    v = {"params": params, "cache": m.init(jax.random.key(0), x, decode=True)["cache"]}
    outs, t = [], 0
    for n in chunks:
        y, mut = m.apply(v, x[:, t:t + n], r[:, t:t + n], decode=True, mutable=["cache"])
        v = {"params": params, **mut}
        outs.append(y)
        t += n
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5)
    # independent formula for row 0 (numpy oracle of the plain stream, plus residual)
    want = oracle_decode.stream(np.asarray(x[0]).T, np.asarray(params["kernel"]),
                                np.asarray(params["bias"]), "silu").T + np.asarray(r[0])
    np.testing.assert_allclose(jnp.concatenate(outs, 1)[0], want, rtol=1e-5, atol=1e-5)


class _Block(nn.Module):
    K: int

    @nn.compact
    def __call__(self, x, decode=False):
        y = CausalConv1d(D, kernel_size=4, activation="silu", bias_init=normal_bias,
                         speculative_tokens=self.K, name="conv")(x, x, decode=decode)
        return y, None


class _Stack(nn.Module):
    K: int
    n: int = 3

    @nn.compact
    def __call__(self, x, decode=False):
        Scan = nn.scan(_Block, variable_axes={"params": 0, "cache": 0},
                       split_rngs={"params": True}, in_axes=nn.broadcast, length=self.n)
        x, _ = Scan(self.K, name="layers")(x, decode)
        return x


def test_linen_stacked_layers_speculative_decode_with_accept_on_the_collection():
    K, T = 3, 60
    rng = np.random.default_rng(11)
    x = _x(12, T)
    m = _Stack(K)
    params = m.init(jax.random.key(0), x)["params"]
    full = jax.jit(lambda p, x: m.apply({"params": p}, x))(params, x)
    cache = m.init(jax.random.key(0), x, decode=True)["cache"]
    assert cache["layers"]["conv"]["cache_seqlens"].shape == (3, B)
    step, accept, _ = _linen_stepper(jax.jit(lambda p, c, xs: m.apply(
        {"params": p, "cache": c}, xs, True, mutable=["cache"])), params, cache)

    _run_spec(step, accept, x, full, 20, _schedule(rng, K, 8), rng)


# --------------------------------------------------------------------------- nnx


@pytest.mark.parametrize("W,K,prefill", [(4, 3, 5), (4, 2, 25), (2, 1, 1), (1, 2, 2)])
def test_nnx_ring_speculative_decode_equals_full(W, K, prefill):
    rng = np.random.default_rng(W + K)
    x = _x(20 + W, 120)
    m = jnnx.CausalConv1d(D, W, activation="silu", bias_init=normal_bias,
                          speculative_tokens=K, rngs=nnx.Rngs(0))
    full = m(x)
    with pytest.raises(ValueError, match="init_cache"):
        m.accept(1)
    m.init_cache(B)
    assert m.cache.shape == (B, W - 1 + K, D) and m.cache_seqlens.shape == (B,)

    @nnx.jit
    def step(m, xs):
        return m(xs, decode=True)

    @nnx.jit
    def accept(m, a):
        m.accept(a)

    sched = _schedule(rng, K, 4) + [(17, rng.integers(17 - K, 18, B))] + _schedule(rng, K, 4)
    p = _run_spec(lambda xs: step(m, xs), lambda a: accept(m, a), x, full, prefill, sched, rng)
    n = _length(m.cache_seqlens, m.step_tokens)
    np.testing.assert_array_equal(n, p)
    win = _decode_cache.ring_window(jnp.asarray(m.cache), n, W - 1)
    for r in range(B):
        np.testing.assert_array_equal(win[r], x[r, p[r] - (W - 1):p[r]])


def test_nnx_stacked_layers_speculative_decode_with_model_accept():
    n, K = 3, 2
    rng = np.random.default_rng(4)
    x = _x(30, 50)

    @nnx.vmap(in_axes=0, out_axes=0)
    def make(key):
        return jnnx.CausalConv1d(D, 4, activation="silu", bias_init=normal_bias,
                                 speculative_tokens=K, rngs=nnx.Rngs(key))

    layers = make(jax.random.split(jax.random.key(0), n))

    forward = scanned_stack()

    full = forward(layers, x)
    nnx.vmap(lambda l: l.init_cache(B), in_axes=0)(layers)
    assert layers.cache.shape == (n, B, 3 + K, D) and layers.cache_seqlens.shape == (n, B)

    @nnx.jit
    def accept(layers, a):
        jnnx.accept(layers, a)

    _run_spec(lambda xs: forward(layers, xs, decode=True), lambda a: accept(layers, a), x,
              full, 7, _schedule(rng, K, 8), rng)


def test_nnx_ordered_cache_and_update_kernel():
    W = 4
    x = _x(40, 40)
    m = jnnx.CausalConv1d(D, W, activation="silu", rngs=nnx.Rngs(0))
    full = m(x)
    m.init_cache(B)
    assert m.cache.shape == (B, W - 1, D) and m.cache_seqlens is None
    with pytest.raises(ValueError, match="speculative_tokens > 0"):
        m.accept(1)
    jnnx.accept(m, 1)  # a model without ring caches: nothing to do
    outs = [m(x[:, :20], decode=True)]
    for t in range(20, 40):
        outs.append(m(x[:, t:t + 1], decode=True))
    np.testing.assert_allclose(jnp.concatenate(outs, 1), full, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m.cache, x[:, 40 - (W - 1):])
    gd, st = nnx.split(m)
    hlo = jax.jit(lambda st, xs: nnx.merge(gd, st)(xs, decode=True)).lower(
        st, x[:, :1]).compile().as_text()
    assert targets.UPDATE in hlo and targets.FORWARD not in hlo
