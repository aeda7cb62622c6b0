"""Quick GPU timings for kernel development (not the recorded benchmark):
ours vs the `-x` copy and the XLA shifted sum on the issue's shapes, then
the decode step. python3 tools/gpu_dev_times.py [decode-only]"""
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from jax_causal_conv.bench import _grad, batched, bench_decode, timeit

rng = np.random.default_rng(0)
if "decode-only" not in sys.argv:
    for (B, D, L), dt, cl in [((8, 4096, 4096), jnp.bfloat16, False), ((4, 2048, 16384), jnp.bfloat16, False),
                              ((8, 4096, 4096), jnp.bfloat16, True), ((8, 4096, 4096), jnp.float32, False),
                              ((32, 512, 1024), jnp.bfloat16, False)]:
        shape = (B, L, D) if cl else (B, D, L)
        x = jnp.asarray(rng.standard_normal(shape), dt)
        w = jnp.asarray(rng.standard_normal((D, 4)) / 2, dt)
        b = jnp.asarray(rng.standard_normal((D,)), dt)
        g = jnp.asarray(rng.standard_normal(shape), dt)
        small = x.size * x.dtype.itemsize < (64 << 20)
        n = 16 if small else 1
        wrap = batched if small else jax.jit
        cf = 1 if small else 10
        xin = tuple(x * (1 + i / n) for i in range(n)) if small else x
        ours = lambda x, w, b: jcc.causal_conv1d(x, w, b, channels_last=cl, backend="ffi")
        ref = lambda x, w, b: jcc.reference.causal_conv1d(x, w, b, channels_last=cl)
        tc = timeit(wrap(lambda x, *_: -x), xin, reps=20, inner=n, calls=cf)
        to = timeit(wrap(ours), xin, w, b, reps=20, inner=n, calls=cf)
        tr = timeit(wrap(ref), xin, w, b, reps=20, inner=n, calls=cf)
        tob = timeit(jax.jit(_grad(ours)), x, w, b, g, reps=20, calls=10)
        trb = timeit(jax.jit(_grad(ref)), x, w, b, g, reps=20, calls=10)
        print(f"{str((B, D, L)):18s} {jnp.dtype(dt).name:8s} {'CL' if cl else 'CF'}  copy {tc*1e3:.4f}  "
              f"ours {to*1e3:.4f} ({tc/to:5.1%})  ref {tr*1e3:.4f}  | fwd+bwd ours {tob*1e3:.4f}  ref {trb*1e3:.4f}",
              flush=True)
bench_decode("gpu")
