"""Probe: device time of our backward kernels under the JAX profiler (GPU).

From the repository root on a GPU machine:
    PYTHONPATH=src:. python3 -m benchmarks.probes.bwd_probe"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from benchmarks.timing import device_events

rng = np.random.default_rng(0)
for shape, act in (((8, 4096, 4096), None), ((8, 4096, 4096), "silu"), ((4, 2048, 16384), None)):
    x = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((shape[1], 4)) / 2, jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((shape[1],)), jnp.bfloat16)
    g = jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
    f = jax.jit(jax.grad(lambda x, w, b, g: jnp.sum(
        jcc.causal_conv1d(x, w, b, activation=act).astype(jnp.float32) * g), argnums=(0, 1, 2)))
    ev = device_events(f, x, w, b, g, n=10)
    k = sorted((e - s) / 1e3 for n, s, e in ev if "Bwd" in n)
    r = sorted((e - s) / 1e3 for n, s, e in ev if "Reduce" in n)
    print(f"{shape} act={act}: "
          f"bwd kernel median {k[len(k)//2]:.1f} us, reduce {r[len(r)//2]:.1f} us", flush=True)
