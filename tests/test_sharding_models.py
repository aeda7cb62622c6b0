"""Sharded programs built on the public API (8 virtual CPU devices): a Flax
model trained with data + sequence + channel parallelism, jax.export of a
sharded function, the layout-pinning wrappers of jax_causal_conv.sharding,
and the example of docs/sharding.md."""

import contextlib
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_causal_conv as jcc
from jax_causal_conv import sharding as S
from helpers import package_env
from sharding_helpers import PLATFORM, close, collectives, compiled, mesh, no_gathers, put

flax_nn = pytest.importorskip("flax.linen")
optax = pytest.importorskip("optax")
rng = np.random.default_rng(2)


def rand(shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape), dtype)


class TwoLayers(flax_nn.Module):
    """Two causal convs (the second with a residual), channels on "embed"."""
    features: int

    @flax_nn.compact
    def __call__(self, x):
        from jax_causal_conv.flax import CausalConv1d
        ax = dict(kernel_axes=("embed", None), bias_axes=("embed",))
        h = CausalConv1d(self.features, 4, activation="silu", **ax)(x)
        return CausalConv1d(self.features, 3, **ax)(h, residual=x)


def _train(params, x, target, steps=3, shardings=None):
    model, opt = TwoLayers(x.shape[-1]), optax.adam(0.05)

    def loss(p, x, t):
        return jnp.mean((model.apply({"params": p}, x) - t) ** 2)

    def step(p, s, x, t):
        v, g = jax.value_and_grad(loss)(p, x, t)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s, v

    state = opt.init(params)
    kw = {} if shardings is None else dict(out_shardings=(shardings, None, None))
    step_c, hlo = compiled(step, params, state, x, target, **kw)
    losses = []
    for _ in range(steps):
        params, state, v = step_c(params, state, x, target)
        losses.append(float(v))
    return params, losses, hlo


@pytest.mark.parametrize("explicit", [False, True])
def test_flax_model_trains_the_same_with_data_sequence_and_channel_splits(explicit):
    B, L, D = 4, 32, 8
    x, target = rand((B, L, D)), rand((B, L, D))
    boxed = TwoLayers(D).init(jax.random.key(0), x)["params"]
    params = flax_nn.meta.unbox(boxed)
    want_p, want_l, _ = _train(params, x, target)

    m = mesh((2, 2, 2), ("data", "seq", "model"), explicit)
    rules = (("embed", "model"),)
    p_shard = flax_nn.logical_to_mesh_sharding(flax_nn.get_partition_spec(boxed), m, rules)
    assert p_shard["CausalConv1d_0"]["kernel"].spec == P("model", None)
    act = NamedSharding(m, P("data", "seq", "model"))
    got_p, got_l, hlo = _train(jax.device_put(params, p_shard), jax.device_put(x, act),
                               jax.device_put(target, act), shardings=p_shard)
    np.testing.assert_allclose(got_l, want_l, rtol=1e-5)
    jax.tree.map(lambda a, b: close(a, b, 1e-5), got_p, want_p)
    assert got_p["CausalConv1d_1"]["kernel"].sharding.is_equivalent_to(
        p_shard["CausalConv1d_1"]["kernel"], 2)
    colls = collectives(hlo)
    no_gathers(colls)   # no activation, nor parameter, is ever gathered
    # the halo exchanges: each layer's W-1 columns of its (B/2, L/2, D/2) block
    halos = {s[0][1] for k, s, _ in colls if k == "collective-permute"}
    assert halos == {(2, 3, 4), (2, 2, 4)}, halos


def test_nnx_module_carries_its_sharding_names():
    from flax import nnx
    from jax_causal_conv.nnx import CausalConv1d
    m = mesh((2, 4), ("data", "model"), explicit=True)
    with jax.sharding.set_mesh(m):
        conv = CausalConv1d(8, 4, kernel_axes=("model", None), bias_axes=("model",),
                            rngs=nnx.Rngs(0))
        x = put(rand((2, 6, 8)), m, P("data", None, "model"))
        y = nnx.jit(lambda c, x: c(x))(conv, x)
    specs = nnx.get_partition_spec(nnx.state(conv))
    assert specs["kernel"].get_value() == P("model", None)
    assert y.sharding.spec == P("data", None, "model")
    plain = CausalConv1d(8, 4, rngs=nnx.Rngs(0))
    assert nnx.get_partition_spec(nnx.state(plain))["kernel"].get_value() == P()
    close(y, plain(np.asarray(x)), 2e-5)


# --- jax.export -------------------------------------------------------------------

def _conv(x, w):
    return jcc.causal_conv1d(x, w, activation="silu")


def test_export_of_an_explicitly_sharded_function_runs_partitioned():
    m = mesh((2, 4), ("b", "s"), explicit=True)
    x, w = rand((4, 8, 32)), rand((8, 4))
    spec = NamedSharding(m, P("b", None, "s"))
    # for the mesh's platform (export would take the default backend's, a GPU's)
    exp = jax.export.export(jax.jit(_conv), platforms=[{"gpu": "cuda"}.get(PLATFORM, PLATFORM)],
                            disabled_checks=jcc.disabled_safety_checks())(
        jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=spec), jax.ShapeDtypeStruct(w.shape,
                                                                                  w.dtype))
    text = exp.mlir_module()
    assert "CustomSPMDPartitioning" not in text and "collective_permute" in text
    again = jax.export.deserialize(exp.serialize())
    xs = jax.device_put(x, spec)
    y = again.call(xs, w)
    close(y, _conv(x, w), 2e-5)
    assert y.sharding.is_equivalent_to(spec, 3)


def test_export_of_an_auto_sharded_function_is_refused_by_jax():
    """custom_partitioning keeps Python callbacks that cannot be serialised
    (docs/sharding.md: export with Explicit axes, or for one device)."""
    m = mesh((4,), ("b",))
    spec = NamedSharding(m, P("b", None, None))
    with pytest.raises(NotImplementedError, match="host_callbacks"):
        jax.export.export(jax.jit(_conv), disabled_checks=jcc.disabled_safety_checks())(
            jax.ShapeDtypeStruct((4, 8, 32), jnp.float32, sharding=spec),
            jax.ShapeDtypeStruct((8, 4), jnp.float32))


def test_inside_a_users_shard_map_the_calls_run_per_block():
    """Under the user's own shard_map (vma-checked) each call runs on its block,
    and a weight replicated over the batch axis gets its gradient summed."""
    m = mesh((4,), ("b",), explicit=True)
    x, w = rand((4, 8, 32)), rand((8, 4))
    conv = lambda x, w: jcc.causal_conv1d(x, w, activation="silu")  # noqa: E731
    f = jax.shard_map(conv, mesh=m, in_specs=(P("b"), P()), out_specs=P("b"))
    loss = lambda fn: lambda x, w: jnp.sum(jnp.sin(fn(x, w)))  # noqa: E731
    got = jax.jit(jax.grad(loss(f), (0, 1)))(put(x, m, P("b")), w)
    for a, e in zip(got, jax.grad(loss(conv), (0, 1))(x, w)):
        close(a, e, 2e-5)


# --- the layout-pinning wrappers -----------------------------------------------------

@pytest.mark.parametrize("explicit", [False, True])
def test_wrappers_place_as_named(explicit):
    m = mesh((2, 4), ("b", "s"), explicit)
    x, w, h = rand((2, 4, 64)), rand((4, 4)), rand((2, 4, 3))
    f = jax.jit(lambda x, w, h: S.causal_conv1d_sharded(
        x, w, mesh=m, batch_axis="b", seq_axis="s", initial_states=h, return_final_states=True))
    with jax.sharding.set_mesh(m) if explicit else contextlib.nullcontext():
        y, fin = f(x, w, h)   # unplaced inputs: placed by the wrapper
        hlo = f.lower(x, w, h).compile().as_text()
    y0, f0 = jcc.causal_conv1d(x, w, initial_states=h, return_final_states=True)
    close(y, y0, 2e-5)
    close(fin, f0, 2e-5)
    assert y.sharding.is_equivalent_to(NamedSharding(m, P("b", None, "s")), 3)
    no_gathers(collectives(hlo))
    st, xt = rand((4, 4, 5)), rand((4, 4))
    y, st2 = S.causal_conv1d_update_sharded(xt, st, w, mesh=m, batch_axis="b")
    for a, e in zip((y, st2), jcc.causal_conv1d_update(xt, st, w)):
        close(a, e, 2e-5)
    cu = jnp.asarray([0, 3, 8], jnp.int32)
    xv = rand((8, 4))
    out = S.causal_conv1d_varlen_sharded(xv, w, cu_seqlens=cu, mesh=m, channel_axis="b",
                                         seq_axis="s")
    close(out, jcc.causal_conv1d_varlen(xv, w, cu_seqlens=cu), 2e-5)
    out = S.causal_conv1d_varlen_states_sharded(xv, cu, 3, mesh=m, channel_axis="b",
                                                seq_axis="s")
    close(out, jcc.causal_conv1d_varlen_states(xv, cu, 3), 0)


def test_wrapper_errors():
    m = mesh((2, 4), ("b", "s"))
    x, w = rand((2, 4, 30)), rand((4, 4))
    for kw, msg in [(dict(seq_axis="s"), "length L = 30 is not divisible by 4"),
                    (dict(seq_axis="q"), "no axis 'q'"),
                    (dict(batch_axis="s", seq_axis="s"), "used by both")]:
        with pytest.raises(ValueError, match=re.escape(msg)):
            S.causal_conv1d_sharded(x, w, mesh=m, **kw)
    with pytest.raises(ValueError, match="channels D = 6"):
        S.causal_conv1d_sharded(rand((2, 6, 32)), rand((6, 4)), mesh=m, channel_axis="s")
    with pytest.raises(ValueError, match="no batch dimension"):
        S.causal_conv1d_varlen_sharded(rand((4, 4)), w, cu_seqlens=jnp.array([0, 4]), mesh=m,
                                       batch_axis="b")
    with pytest.raises(ValueError, match="tokens T = 6 is not divisible by 4"):
        S.causal_conv1d_varlen_states_sharded(rand((6, 4)), jnp.array([0, 6]), 3, mesh=m,
                                              seq_axis="s")


def test_docs_example_runs(tmp_path):
    path = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "sharding.md")
    if not os.path.exists(path):  # an installed test tree without docs
        pytest.skip("no docs/sharding.md")
    # The example is a script for 8 CPU devices (it sets XLA_FLAGS before it
    # imports jax): run as one, in a fresh process on the CPU, whatever the
    # default backend here (conftest.py's XLA_FLAGS ask for the 8 devices).
    code = "\n".join(re.findall(r"```python\n(.*?)```", open(path).read(), re.S))
    env = package_env(JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == [
        "P('data', 'seq') True",
        "['all-reduce f32[1,128,4]+f32[1,128]', 'collective-permute f32[2,3,128]']",
        "P('data', 'seq', None)"], r.stdout
