"""Shared by the GPU test files: the devices, the skip marks, the dtypes and
tolerances, random inputs, the GPU-against-CPU comparison and gradients
through jax.vjp."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_causal_conv._lowering import targets

try:
    GPU = jax.devices("gpu")[0]
except RuntimeError:
    GPU = None
CPU = jax.devices("cpu")[0]
# JCC_GPU_TESTS_ON_CPU=1: a dry run of the GPU tests with the CPU standing in
# for the GPU (CPU against CPU), to find faults of the tests' own code before
# spending device time on them. It proves nothing about the CUDA kernels.
DRY_RUN = os.environ.get("JCC_GPU_TESTS_ON_CPU") == "1"
if DRY_RUN:
    GPU = CPU

# pytestmark of a GPU test file
MARKS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not DRY_RUN and (GPU is None or targets._jcc_cuda is None),
                       reason="needs a CUDA GPU and _jcc_cuda"),
]

DT = {"float32": jnp.float32, "float16": jnp.float16, "bfloat16": jnp.bfloat16}
# max |gpu - cpu| / max(1, max |cpu|): both accumulate in float32 and round once.
REL = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}


def run(dev, f, *args):
    args = jax.device_put(args, dev)
    out = jax.jit(f)(*args)
    return jax.tree.map(lambda a: np.asarray(a.astype(jnp.float32) if a.dtype != jnp.float64 else a,
                                             np.float64), out)


def rel_err(g, w):
    return np.max(np.abs(g - w), initial=0.0) / max(1.0, np.max(np.abs(w), initial=0.0))


def check(f, args, dtype, what=""):
    """f on the GPU against f on the CPU: same shapes, every entry finite on
    both (a non-finite output fails: tests that expect some compare them
    entry by entry, same_entries below), relative error within REL[dtype].
    Returns the GPU's outputs."""
    got, want = run(GPU, f, *args), run(CPU, f, *args)
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        assert g.shape == w.shape, (what, i)
        assert np.isfinite(g).all() and np.isfinite(w).all(), (what, i, "non-finite output")
        err = rel_err(g, w)
        assert err <= REL[dtype], f"{what} output {i}: rel err {err:.3g} > {REL[dtype]}"
    return got


def same_under_settings(monkeypatch, env, reference, settings, f, args):
    """f's outputs on the GPU with the environment variable `env` at each of
    `settings` (None: unset) equal, bit for bit, those with it at
    `reference`. (A new program for each setting: one replayed from a CUDA
    graph would keep the launch it recorded under the first.)"""
    monkeypatch.setenv(env, reference)
    want = run(GPU, lambda *a: f(*a), *args)
    for value in settings:
        if value is None:
            monkeypatch.delenv(env)
        else:
            monkeypatch.setenv(env, value)
        got = run(GPU, lambda *a: f(*a), *args)
        for i, (g, e) in enumerate(zip(got, want)):
            assert np.array_equal(g, e, equal_nan=True), f"{env}={value}, output {i}"


def same_entries(got, want, dtype):
    """Every output alike, entry by entry: the same non-finite entries, the
    finite ones within REL[dtype] (check's twin for outputs expected to
    hold non-finite values)."""
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.array_equal(np.isfinite(g), np.isfinite(e))
        ok = np.isfinite(e)
        assert rel_err(g[ok], e[ok]) <= REL[dtype]


def inputs(rng, B, D, L, W, dtype, cl, N=None):
    dt = DT[dtype]
    xs = (B, L, D) if cl else (B, D, L)
    x = jnp.asarray(rng.standard_normal(xs), dt)
    w = jnp.asarray(rng.standard_normal((D, W)) / np.sqrt(W), dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    rows = B if N is None else N
    st = (rows, W - 1, D) if cl else (rows, D, W - 1)
    init = jnp.asarray(rng.standard_normal(st), dt)
    return x, w, b, init


def grads(f, argnums):
    """Gradient of sum(outputs * fixed cotangents), through jax.vjp."""
    def g(*args):
        out, vjp = jax.vjp(lambda *a: f(*a), *args)
        cts = jax.tree.map(lambda o: jnp.cos(jnp.arange(o.size, dtype=jnp.float32).reshape(o.shape)).astype(o.dtype), out)
        gs = vjp(cts)
        return out, tuple(gs[i] for i in argnums)
    return g
