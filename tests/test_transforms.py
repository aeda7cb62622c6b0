"""vmap folds into one launch, jit, grad under vmap, and jax.export round trips."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_causal_conv as jcc
from jax_causal_conv import reference

from helpers import close, custom_calls, package_env, rand

rng = np.random.default_rng(0)
B, D, L, W = 2, 6, 13, 4
X = rand(rng, (3, B, D, L))
WT = rand(rng, (3, D, W))
BI = rand(rng, (3, D))
H = rand(rng, (3, B, D, W - 1))


def conv(x, w, b, h):
    return jcc.causal_conv1d(x, w, b, activation="silu", initial_states=h,
                             return_final_states=True)


def _loop(fn, args, axes):
    outs = [fn(*[a if ax is None else jnp.take(a, i, axis=ax) for a, ax in zip(args, axes)])
            for i in range(3)]
    return jax.tree.map(lambda *o: jnp.stack(o), *outs)


@pytest.mark.parametrize("axes", [(0, None, None, None), (None, 0, None, None),
                                  (0, 0, 0, 0), (None, None, 0, None), (None, None, None, 0),
                                  (0, 0, None, None), (None, 0, 0, 0)])
def test_vmap_any_argument_is_one_custom_call(axes):
    args = [a if ax is not None else a[0] for a, ax in zip((X, WT, BI, H), axes)]
    got = jax.vmap(conv, in_axes=axes)(*args)
    want = _loop(conv, args, axes)
    for g, e in zip(got, want):
        close(g, e, jnp.float32)
    hlo = jax.jit(jax.vmap(conv, in_axes=axes)).lower(*args).as_text()
    assert custom_calls(hlo) == 1


def test_nested_vmap_on_inner_axes_is_one_custom_call():
    x = rand(rng, (2, B, D, 3, L))  # mapped axes 0 and 3
    w = rand(rng, (3, D, W))
    # ("ffi": the kernel's batching rule; "auto" may route a small forward
    # to XLA on a GPU)
    f = jax.vmap(jax.vmap(lambda x, w: jcc.causal_conv1d(x, w, backend="ffi"), in_axes=(2, 0)),
                 in_axes=(0, None))
    got = f(x, w)
    want = jnp.stack([jnp.stack([reference.causal_conv1d(x[i, :, :, j], w[j]) for j in range(3)])
                      for i in range(2)])
    close(got, want, jnp.float32)
    assert custom_calls(jax.jit(f).lower(x, w).as_text()) == 1


def test_grad_under_vmap_and_vmap_under_grad():
    g = rand(rng, (3, B, D, L))

    def loss(x, w, b, h, g):
        y, f = conv(x, w, b, h)
        return jnp.sum(y * g) + jnp.sum(f)

    def loss_ref(x, w, b, h, g):
        y, f = reference.causal_conv1d(x, w, b, activation="silu", initial_states=h,
                                       return_final_states=True)
        return jnp.sum(y * g) + jnp.sum(f)

    for axes in [(0, None, None, 0, 0), (0, 0, 0, 0, 0), (None, 0, None, None, 0)]:
        args = [a if ax is not None else a[0] for a, ax in zip((X, WT, BI, H, g), axes)]
        got = jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)), in_axes=axes)(*args)
        want = jax.vmap(jax.grad(loss_ref, argnums=(0, 1, 2, 3)), in_axes=axes)(*args)
        for a, e in zip(got, want):
            close(a, e, jnp.float32, 10)
        hlo = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2, 3)), in_axes=axes)).lower(
            *args).as_text()
        assert custom_calls(hlo, "jax_causal_conv_bwd_v2") == 1
    # grad of a vmapped, summed loss: weights shared across the mapped axis
    gw = jax.grad(lambda w: jnp.sum(jax.vmap(lambda x: conv(x, w, BI[0], None)[0])(X)))(WT[0])
    gw_ref = jax.grad(lambda w: jnp.sum(jax.vmap(lambda x: reference.causal_conv1d(
        x, w, BI[0], activation="silu"))(X)))(WT[0])
    close(gw, gw_ref, jnp.float32, 10)


def test_vmap_seq_idx_channels_last_and_residual():
    s = jnp.asarray(np.sort(rng.integers(0, 3, (3, B, L)), axis=-1), jnp.int32)
    x = jnp.swapaxes(X, 2, 3)
    r = rand(rng, x.shape)
    f = lambda x, s, r: jcc.causal_conv1d(x, WT[0], seq_idx=s, residual=r, channels_last=True)
    fr = lambda x, s, r: reference.causal_conv1d(x, WT[0], seq_idx=s, residual=r,
                                                 channels_last=True)
    close(jax.vmap(f)(x, s, r), jax.vmap(fr)(x, s, r), jnp.float32)
    assert custom_calls(jax.jit(jax.vmap(f)).lower(x, s, r).as_text()) == 1


def test_vmap_varlen_and_varlen_states():
    cu = jnp.asarray([[0, 4, 9, 20], [0, 0, 11, 20], [0, 20, 20, 20]], jnp.int32)
    x = rand(rng, (3, 20, D))
    h = rand(rng, (3, 3, D, W - 1))
    f = lambda x, cu, w, h: jcc.causal_conv1d_varlen(x, w, cu_seqlens=cu, initial_states=h,
                                                     return_final_states=True)
    fr = lambda x, cu, w, h: reference.causal_conv1d_varlen(
        x, w, cu_seqlens=cu, initial_states=h, return_final_states=True)
    for axes in [(0, 0, None, 0), (0, 0, 0, 0), (None, 0, None, None)]:
        args = [a if ax is not None else a[0] for a, ax in zip((x, cu, WT, h), axes)]
        for g, e in zip(jax.vmap(f, in_axes=axes)(*args), jax.vmap(fr, in_axes=axes)(*args)):
            close(g, e, jnp.float32)
        assert custom_calls(jax.jit(jax.vmap(f, in_axes=axes)).lower(*args).as_text()) == 1
    vs = jax.vmap(lambda x, cu: jcc.causal_conv1d_varlen_states(x, cu, 5))
    np.testing.assert_array_equal(
        vs(x, cu), jax.vmap(lambda x, cu: reference.causal_conv1d_varlen_states(x, cu, 5))(x, cu))
    assert custom_calls(jax.jit(vs).lower(x, cu).as_text()) == 1


def test_vmap_update():
    st = rand(rng, (3, 4, D, 5))
    xt = rand(rng, (3, B, D))
    idx = jnp.asarray([[3, -1], [0, 1], [2, 3]], jnp.int32)
    lens = jnp.asarray([[1, 7], [0, 3], [12, 2]], jnp.int32)
    f = lambda x, s, w, i, c: jcc.causal_conv1d_update(x, s, w, conv_state_indices=i,
                                                       cache_seqlens=c)
    fr = lambda x, s, w, i, c: reference.causal_conv1d_update(x, s, w, conv_state_indices=i,
                                                              cache_seqlens=c)
    for axes in [(0, 0, None, 0, 0), (0, None, 0, None, None), (None, 0, None, 0, None),
                 (0, 0, 0, 0, 0)]:
        args = [a if ax is not None else a[0] for a, ax in zip((xt, st, WT, idx, lens), axes)]
        for g, e in zip(jax.vmap(f, in_axes=axes)(*args), jax.vmap(fr, in_axes=axes)(*args)):
            close(g, e, jnp.float32)
        assert custom_calls(jax.jit(jax.vmap(f, in_axes=axes)).lower(*args).as_text()) == 1


EXPORT_CHILD = textwrap.dedent("""
    import sys, numpy as np, jax
    jax.config.update("jax_enable_x64", True)
    import jax_causal_conv  # registers the FFI targets
    exp = jax.export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
    data = np.load(sys.argv[2])
    outs = exp.call(*[data[f"in{i}"] for i in range(len(exp.in_avals))])
    for i, o in enumerate(jax.tree.leaves(outs)):
        np.testing.assert_array_equal(np.asarray(o), data[f"out{i}"])
    print("EXPORT-OK", len(jax.tree.leaves(outs)))
""")


@pytest.mark.on_cpu  # the child runs on the CPU and compares bit for bit with ours
def test_export_round_trip_in_a_fresh_process(tmp_path):
    cu = jnp.asarray([0, 3, 13], jnp.int32)

    def model(x, w, b, h, st, xt):
        y, f = jcc.causal_conv1d(x, w, b, activation="silu", initial_states=h,
                                 return_final_states=True)
        g = jax.grad(lambda x: jnp.sum(jcc.causal_conv1d(x, w, b) ** 2))(x)
        yv = jcc.causal_conv1d_varlen(x[0].T, w, cu_seqlens=cu)
        vs = jcc.causal_conv1d_varlen_states(x[0].T, cu, 3)
        yu, st = jcc.causal_conv1d_update(xt, st, w, b)
        return y, f, g, yv, vs, yu, st

    args = (X[0], WT[0], BI[0], H[0], rand(rng, (B, D, 3)), rand(rng, (B, D)))
    exp = jax.export.export(jax.jit(model), platforms=["cpu"],
                            disabled_checks=jcc.disabled_safety_checks())(*args)
    (tmp_path / "f.bin").write_bytes(exp.serialize())
    outs = jax.tree.leaves(jax.jit(model)(*args))
    np.savez(tmp_path / "d.npz", **{f"in{i}": np.asarray(a) for i, a in enumerate(args)},
             **{f"out{i}": np.asarray(o) for i, o in enumerate(outs)})
    (tmp_path / "child.py").write_text(EXPORT_CHILD)
    env = package_env(JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "f.bin"),
                        str(tmp_path / "d.npz")], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"EXPORT-OK {len(outs)}" in r.stdout


def test_export_without_the_disabled_checks_names_our_targets():
    with pytest.raises(ValueError, match="jax_causal_conv_fwd_v2"):
        jax.export.export(jax.jit(lambda x, w: jcc.causal_conv1d(x, w, backend="ffi")))(X[0], WT[0])
