"""The decode scan compiled with and without XLA's dynamic-slice fusion
(xla_gpu_enable_dynamic_slice_fusion), ours against the empty body in
alternating rounds, at B=64 D=4096 and B=256 D=8192. For the choice in
jax_causal_conv/_calls.py (_NO_SLICE_FUSION_MAX_BYTES); set that to 0 in the
code to see the fusion that the library's barriers otherwise prevent.
    python3 tools/scan_dsf_probe.py"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from benchmarks.bench import timeit_pair

rng = np.random.default_rng(0)
dt, W = jnp.bfloat16, 4
for B, D in ((64, 4096), (256, 8192)):
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    xs = jnp.asarray(rng.standard_normal((256, B, D)), dt)
    s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)

    def ours(s, x):
        y, s = jcc.causal_conv1d_update(x, s, w, b, activation="silu")
        return s, y

    def comp(body, opts):
        f = jax.jit(lambda s, xs: lax.scan(body, s, xs))
        return f.lower(s0, xs).compile(opts) if opts else f

    empty = lambda s, x: lax.optimization_barrier((s, x))
    for rnd in range(3 if B == 64 else 1):
        for name, opts in (("default", None), ("no DSF", {"xla_gpu_enable_dynamic_slice_fusion": False})):
            fo, fe = comp(ours, opts), comp(empty, opts)
            if rnd == 0:
                txt = fo.as_text() if opts else fo.lower(s0, xs).compile().as_text()
                print(f"B={B} {name}: dynamic-slice fusion in the HLO: "
                      f"{'dynamic_slice_fusion' in txt or 'dynamic-slice-fusion' in txt}")
            t_o, t_e, t_add = (t * 1e6 / 256 for t in timeit_pair(fo, fe, (s0, xs), reps=25, calls=3))
            print(f"B={B} round {rnd} {name}: ours {t_o:.2f}, empty {t_e:.2f} us/step, adds {t_add:.2f}", flush=True)
