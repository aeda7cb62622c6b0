"""Device-side timelines from the JAX profiler: which kernels a jitted program
runs, how long each takes on the GPU, and the gaps between them. For kernel
work, not the recorded benchmark.
    python3 tools/trace_probe.py [decode] [small] [conv] [scan]"""
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from jax_causal_conv.bench import batched, decode_stepper, device_events, timeit


def summarize(title, ev, steps):
    if not ev:
        print(f"{title}: no device events")
        return
    by = {}
    for name, s, e in ev:
        by.setdefault(name[:60], []).append(e - s)
    span = ev[-1][2] - ev[0][1]
    busy = sum(e - s for _, s, e in ev)
    print(f"== {title}: {len(ev)} events in {steps} runs; span {span/1e3/steps:.2f} us/run, "
          f"busy {busy/1e3/steps:.2f} us/run")
    for name, ds in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:8]:
        print(f"   {len(ds)/steps:6.1f}/run  median {statistics.median(ds)/1e3:8.2f} us  {name}")
    gaps = [ev[i + 1][1] - ev[i][2] for i in range(len(ev) - 1)]
    if gaps:
        print(f"   gaps between events: median {statistics.median(gaps)/1e3:.2f} us, "
              f"max {max(gaps)/1e3:.2f} us")


def main():
    rng = np.random.default_rng(0)
    dt = jnp.bfloat16
    what = sys.argv[1:] or ["decode", "small", "conv", "scan"]

    if "decode" in what:
        W, layers = 4, 32
        for B, D in ((64, 4096), (256, 8192)):
            ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(layers)]
            bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(layers)]
            x = jnp.asarray(rng.standard_normal((B, D)), dt)
            for backend in ("ffi", "xla"):
                run = decode_stepper(layers, backend, [jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
                                                       for _ in range(layers)])
                t_sync = timeit(run, x, ws, bs, reps=20)
                t_async = timeit(run, x, ws, bs, reps=7, calls=20)
                print(f"decode B={B} D={D} {backend}: per layer {t_sync*1e6/layers:.2f} us (sync each step), "
                      f"{t_async*1e6/layers:.2f} us (20 steps async)")
                summarize(f"decode B={B} D={D} {backend}, one step", device_events(run, x, ws, bs, n=10), 10)

    if "scan" in what:
        B, D, W = 64, 4096, 4
        w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
        b = jnp.asarray(rng.standard_normal((D,)), dt)
        s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
        xs = jnp.asarray(rng.standard_normal((256, B, D)), dt)

        def scan_of(body):
            return jax.jit(lambda s, xs: lax.scan(body, s, xs))

        bodies = {
            "ours": lambda s, x: jcc.causal_conv1d_update(x, s, w, b, activation="silu")[::-1],
            "xla update": lambda s, x: jcc.causal_conv1d_update(x, s, w, b, activation="silu",
                                                                backend="xla")[::-1],
            "empty (s, x)": lambda s, x: (s, x),
            "minimal (s, x + 1)": lambda s, x: (s, x + 1),
            "barrier (s, x)": lambda s, x: lax.optimization_barrier((s, x)),
        }
        for name, body in bodies.items():
            f = scan_of(body)
            t = timeit(f, s0, xs, reps=7, calls=3)
            print(f"scan 256 steps, body {name}: {t*1e6/256:.2f} us/step")
            summarize(f"scan body {name}", device_events(f, s0, xs, n=2), 2 * 256)
            txt = f.lower(s0, xs).compile().as_text()
            print("   while loops:", txt.count(" while("), " command buffers:", txt.count("command_buffer"))

    if "small" in what:
        x = jnp.asarray(rng.standard_normal((32, 512, 1024)), dt)
        w = jnp.asarray(rng.standard_normal((512, 4)) / 2, dt)
        b = jnp.asarray(rng.standard_normal((512,)), dt)
        xs = tuple(x * (1 + i / 16) for i in range(16))
        for name, fn in (("copy", lambda x, w, b: -x),
                         ("ours", lambda x, w, b: jcc.causal_conv1d(x, w, b, backend="ffi")),
                         ("ref", lambda x, w, b: jcc.reference.causal_conv1d(x, w, b))):
            f1 = jax.jit(fn)
            print(f"(32,512,1024) {name}: jit x20 async {timeit(f1, x, w, b, reps=7, calls=20)*1e6:.2f} us/call; "
                  f"batched16 {timeit(batched(fn), xs, w, b, reps=7, calls=3, inner=16)*1e6:.2f} us/call")
            summarize(f"(32,512,1024) {name} single jit", device_events(f1, x, w, b, n=20), 20)
            summarize(f"(32,512,1024) {name} batched16", device_events(batched(fn), xs, w, b, n=2), 32)

    if "conv" in what:
        for shape, cl, dty in (((8, 4096, 4096), True, dt), ((8, 4096, 4096), False, dt)):
            B, D, L = shape
            xshape = (B, L, D) if cl else (B, D, L)
            x = jnp.asarray(rng.standard_normal(xshape), dty)
            w = jnp.asarray(rng.standard_normal((D, 4)) / 2, dty)
            b = jnp.asarray(rng.standard_normal((D,)), dty)
            g = jnp.asarray(rng.standard_normal(xshape), dty)
            for name, fn in (("copy", lambda x, w, b: -x),
                             ("ours", lambda x, w, b: jcc.causal_conv1d(x, w, b, channels_last=cl, backend="ffi")),
                             ("ref", lambda x, w, b: jcc.reference.causal_conv1d(x, w, b, channels_last=cl))):
                tag = f"{shape} {'CL' if cl else 'CF'} {name}"
                summarize(f"{tag} fwd", device_events(jax.jit(fn), x, w, b, n=10), 10)
                if name != "copy":
                    gr = jax.jit(jax.grad(lambda x, w, b, g: jnp.sum(fn(x, w, b).astype(jnp.float32) * g),
                                          argnums=(0, 1, 2)))
                    summarize(f"{tag} fwd+bwd", device_events(gr, x, w, b, g, n=10), 10)


if __name__ == "__main__":
    main()
