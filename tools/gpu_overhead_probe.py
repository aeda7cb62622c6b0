"""Per-call overhead of our custom calls inside jitted loops and multi-layer
steps (run it under different XLA_FLAGS to see what command buffers do):
    XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 tools/gpu_overhead_probe.py"""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from jax_causal_conv.bench import looped, timeit

rng = np.random.default_rng(0)
dt = jnp.bfloat16
res = {}
x = jnp.asarray(rng.standard_normal((32, 512, 1024)), dt)
w = jnp.asarray(rng.standard_normal((512, 4)) / 2, dt)
b = jnp.asarray(rng.standard_normal((512,)), dt)
for name, fn in (("copy", lambda x, w, b: -x),
                 ("ours", lambda x, w, b: jcc.causal_conv1d(x, w, b, backend="ffi")),
                 ("ref", lambda x, w, b: jcc.reference.causal_conv1d(x, w, b))):
    res[f"(32,512,1024) fwd in fori_loop, {name}"] = timeit(looped(fn, 50), x, w, b, reps=15, inner=50) * 1e6
    res[f"(32,512,1024) fwd jit x10 async, {name}"] = timeit(jax.jit(fn), x, w, b, reps=15, calls=10) * 1e6

B, D, W, layers = 64, 4096, 4, 32
ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(layers)]
bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(layers)]
xt = jnp.asarray(rng.standard_normal((B, D)), dt)
for backend in ("ffi", "xla"):
    states = [jnp.asarray(rng.standard_normal((B, D, W - 1)), dt) for _ in range(layers)]

    @functools.partial(jax.jit, donate_argnums=(0,))
    def step(states, x, ws, bs):
        new = []
        for l in range(layers):
            x, s = jcc.causal_conv1d_update(x, states[l], ws[l], bs[l], activation="silu", backend=backend)
            new.append(s)
        return new, x

    import time, statistics
    for _ in range(5):
        states, y = step(states, xt, ws, bs)
    ts = []
    for _ in range(30):
        t0 = time.perf_counter()
        states, y = step(states, xt, ws, bs)
        jax.block_until_ready((states, y))
        ts.append(time.perf_counter() - t0)
    res[f"decode 32-layer step per layer, {backend}"] = statistics.median(ts) * 1e6 / layers
    # the same step 10 times back to back, one sync: host dispatch amortised
    t0 = time.perf_counter()
    for _ in range(10):
        states, y = step(states, xt, ws, bs)
    jax.block_until_ready((states, y))
    res[f"decode 32-layer step per layer, 10 async, {backend}"] = (time.perf_counter() - t0) * 1e6 / 10 / layers

    s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
    xs = jnp.asarray(rng.standard_normal((256, B, D)), dt)

    @jax.jit
    def scan(s, xs):
        def body(s, x):
            y, s = jcc.causal_conv1d_update(x, s, ws[0], bs[0], activation="silu", backend=backend)
            return s, y
        return jax.lax.scan(body, s, xs)
    res[f"scan 256 steps per step, {backend}"] = timeit(scan, s0, xs, reps=15) * 1e6 / 256
print("XLA_FLAGS =", os.environ.get("XLA_FLAGS", ""))
for k, v in res.items():
    print(f"  {k:55s} {v:9.2f} us")
