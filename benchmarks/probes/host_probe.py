"""Probe: host side of the decode step and scan, ours against the XLA yardstick (GPU).

Back-to-back times and the costliest host trace events; run it under different
XLA_FLAGS to compare runtime options. From the repository root:
    PYTHONPATH=src:. python3 -m benchmarks.probes.host_probe [decode] [scan]"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from benchmarks.decode_step import decode_stepper
from benchmarks.timing import timeit, timeit_pair
from benchmarks.probes.trace_probe import host_summary

rng = np.random.default_rng(0)
dt, W, L, B, D = jnp.bfloat16, 4, 32, 64, 4096
what = sys.argv[1:] or ["decode", "scan"]

if "decode" in what:
    ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(L)]
    bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(L)]
    x = jnp.asarray(rng.standard_normal((B, D)), dt)
    for name, backend, H in (("ours", "ffi", W - 1), ("yardstick", "negate", W)):
        run = decode_stepper(L, backend, [jnp.asarray(rng.standard_normal((B, D, H)), dt) for _ in range(L)])
        ts = [timeit(run, x, ws, bs, reps=15, calls=20, min_sample_s=0.02) * 1e6 / L for _ in range(2)]
        print(f"decode B={B} {name}: back to back {ts[0]:.2f} {ts[1]:.2f} us/layer", flush=True)
        host_summary(f"decode {name}", run, x, ws, bs, n=10)

if "scan" in what:
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    xs = jnp.asarray(rng.standard_normal((256, B, D)), dt)
    s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
    a0 = jnp.asarray(rng.standard_normal((B, D, W)), dt)

    def ours(s, x):
        y, s = jcc.causal_conv1d_update(x, s, w, b, activation="silu")
        return s, y

    scan = lambda body: jax.jit(lambda s, xs: lax.scan(body, s, xs))
    empty = scan(lambda s, x: lax.optimization_barrier((s, x)))
    for name, f, c in (("ours", scan(ours), s0),
                       ("yardstick", scan(lambda a, x: lax.optimization_barrier((-a, x))), a0)):
        t_f, t_e, t_add = (t * 1e6 / 256 for t in timeit_pair(f, empty, (c, xs), reps=25, calls=3))
        print(f"scan {name}: {t_f:.2f} us/step, empty {t_e:.2f}, adds {t_add:.2f}", flush=True)
        host_summary(f"scan {name} (per 256 steps)", f, c, xs, n=2)
