"""Runs one forward and one forward+backward of the benchmark shape, for a
kernel profiler (ncu) to time every kernel XLA launches:

    ncu --metrics gpu__time_duration.sum python3 -m benchmarks.probes.gpu_kernel_probe [cl]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc

cl = len(sys.argv) > 1 and sys.argv[1] == "cl"
B, D, L = 8, 4096, 4096
rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((B, L, D) if cl else (B, D, L)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((D, 4)), jnp.bfloat16)
b = jnp.asarray(rng.standard_normal((D,)), jnp.bfloat16)
g = jnp.asarray(rng.standard_normal(x.shape), jnp.bfloat16)
f = lambda x, w, b: jcc.causal_conv1d(x, w, b, channels_last=cl, backend="ffi")
fwd = jax.jit(f)
grad = jax.jit(jax.grad(lambda x, w, b, g: jnp.sum(f(x, w, b).astype(jnp.float32) * g), argnums=(0, 1, 2)))
fwd(x, w, b).block_until_ready()
jax.block_until_ready(grad(x, w, b, g))
print("---- timed calls ----", flush=True)
fwd(x, w, b).block_until_ready()
jax.block_until_ready(grad(x, w, b, g))
print(jax.jit(jax.grad(lambda x, w, b, g: jnp.sum(f(x, w, b).astype(jnp.float32) * g), argnums=(0, 1, 2))).lower(x, w, b, g).compile().as_text()[-3000:])

# decode: one update call, as the benchmark's fori_loop body does it
st = jnp.asarray(rng.standard_normal((64, 4096, 3)), jnp.bfloat16)
xt = jnp.asarray(rng.standard_normal((64, 4096)), jnp.bfloat16)
upd = jax.jit(lambda x, s: jcc.causal_conv1d_update(x, s, w, b, activation="silu"), donate_argnums=(1,))
y, st = upd(xt, st)
print("---- update ----", flush=True)
y, st = upd(xt, st)
jax.block_until_ready(st)
