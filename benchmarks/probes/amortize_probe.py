"""How much of the small-shape and scan wall times is the start and end of
each timed sample rather than the work: (32,512,1024) batched programs timed
with 4, 16 and 48 programs per sample (alternating), the device span per
call from the profiler; the 256-step decode scan timed as alternating
(ours, empty) pairs; scan-variants: the scan's host trace, and XLA options
that change how its custom call runs. For kernel work, not the recorded
benchmark.
    python3 tools/amortize_probe.py [small] [scan] [scan-variants] [hlo_dir]"""
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from benchmarks.bench import _block, _sample as sample, batched, device_events, timeit_pair
from benchmarks.probes.trace_probe import host_summary, summarize

rng = np.random.default_rng(0)
dt = jnp.bfloat16
what = sys.argv[1:] or ["small", "scan"]


B, D, W = 64, 4096, 4
if "scan" in what or "scan-variants" in what:
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
    xs = jnp.asarray(rng.standard_normal((256, B, D)), dt)


def ours(s, x):
    y, s = jcc.causal_conv1d_update(x, s, w, b, activation="silu")
    return s, y


# the decode scan, and the same scan with an empty body XLA keeps
scan_o = jax.jit(lambda s, xs: lax.scan(ours, s, xs))
scan_e = jax.jit(lambda s, xs: lax.scan(lambda s, x: lax.optimization_barrier((s, x)), s, xs))

if "small" in what:
    x = jnp.asarray(rng.standard_normal((32, 512, 1024)), dt)
    w1 = jnp.asarray(rng.standard_normal((512, 4)) / 2, dt)
    b1 = jnp.asarray(rng.standard_normal((512,)), dt)
    x16 = tuple(x * (1 + i / 16) for i in range(16))
    fns = {"copy": batched(lambda x, w, b: -x),
           "ours": batched(lambda x, w, b: jcc.causal_conv1d(x, w, b, backend="ffi"))}
    for f in fns.values():
        for _ in range(5):
            _block(f(x16, w1, b1))
    times = {(n, c): [] for n in fns for c in (4, 16, 48)}
    for _ in range(12):
        for (n, c) in times:
            times[(n, c)].append(sample(fns[n], (x16, w1, b1), c) / (16 * c))
    for (n, c), ts in times.items():
        print(f"(32,512,1024) {n} batched16, {c:2d} programs/sample: median {statistics.median(ts)*1e6:.2f} "
              f"min {min(ts)*1e6:.2f} us/call")
    for n, f in fns.items():  # device span and busy time per call, over 16 programs
        summarize(f"(32,512,1024) {n}, per call", device_events(f, x16, w1, b1, n=16), 16 * 16)

if "scan" in what:
    f_o, f_e = scan_o, scan_e
    hlo_dir = next((a for a in what if a.startswith("/")), None)
    if hlo_dir:
        for n, f in (("ours", f_o), ("empty", f_e)):
            with open(f"{hlo_dir}/scan_{n}.hlo.txt", "w") as fh:
                fh.write(f.lower(s0, xs).compile().as_text())
    for calls in (1, 3):
        t_o, t_e, t_add = (t * 1e6 / 256 for t in timeit_pair(f_o, f_e, (s0, xs), reps=25, calls=calls))
        print(f"scan, {calls} scan(s)/sample, 25 alternating pairs: ours {t_o:.2f}, empty {t_e:.2f} us/step, "
              f"paired difference median {t_add:.2f}")
    for n, f in (("ours", f_o), ("empty", f_e)):
        summarize(f"scan {n}, per step", device_events(f, s0, xs, n=2), 2 * 256)

if "scan-variants" in what:
    # where the per-step host time of the scan goes, and XLA options that
    # change how the body's custom call is run (probe only: the recorded
    # benchmark uses XLA's defaults)
    host_summary("scan ours (per 256 steps)", scan_o, s0, xs, n=2)
    host_summary("scan empty (per 256 steps)", scan_e, s0, xs, n=2)
    variants = {"default": None,
                "no dynamic-slice fusion": {"xla_gpu_enable_dynamic_slice_fusion": False},
                "cmd buffers incl. DYNAMIC_SLICE_FUSION":
                    {"xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL,DYNAMIC_SLICE_FUSION"}}
    for name, opts in variants.items():
        try:
            fo = scan_o.lower(s0, xs).compile(opts) if opts else scan_o
            fe = scan_e.lower(s0, xs).compile(opts) if opts else scan_e
            t_o, t_e, t_add = (t * 1e6 / 256 for t in timeit_pair(fo, fe, (s0, xs), reps=15, calls=2))
            print(f"scan variant {name}: ours {t_o:.2f}, empty {t_e:.2f} us/step, adds {t_add:.2f}")
        except Exception as e:
            print(f"scan variant {name}: {type(e).__name__}: {str(e)[:300]}")
