"""Per-step cost of a 256-step decode scan (ours) against the same scan with
an empty body XLA keeps, measured before and after a profiler trace (to see
whether a trace leaves launches slower)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from jax_causal_conv.bench import device_busy_us, timeit

rng = np.random.default_rng(0)
B, D, W = 64, 4096, 4
dt = jnp.bfloat16
w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
b = jnp.asarray(rng.standard_normal((D,)), dt)
s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
xs = jnp.asarray(rng.standard_normal((256, B, D)), dt)


def ours(s, x):
    y, s = jcc.causal_conv1d_update(x, s, w, b, activation="silu")
    return s, y


f_o = jax.jit(lambda s, xs: lax.scan(ours, s, xs))
f_e = jax.jit(lambda s, xs: lax.scan(lambda s, x: lax.optimization_barrier((s, x)), s, xs))
for when in ("before a trace", "after a trace"):
    for calls in (1, 3):
        t_o = timeit(f_o, s0, xs, reps=15, calls=calls) / 256 * 1e6
        t_e = timeit(f_e, s0, xs, reps=15, calls=calls) / 256 * 1e6
        print(f"{when}, {calls} scans per sample: ours {t_o:.2f} us/step, empty {t_e:.2f} us/step, "
              f"adds {t_o - t_e:.2f}", flush=True)
    if when == "before a trace":
        print(f"device busy per scan step: ours {device_busy_us(f_o, s0, xs, n=2) / 256:.2f} us, "
              f"empty {device_busy_us(f_e, s0, xs, n=2) / 256:.2f} us", flush=True)
