"""Probe: device timelines from the JAX profiler: kernels, their times and gaps (GPU).

For kernel work, not the recorded benchmark. From the repository root:
    PYTHONPATH=src:. python3 -m benchmarks.probes.trace_probe [decode | decode-more] [small] [conv] [scan]"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import statistics

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from jax_causal_conv._lowering import targets as _ffi
from benchmarks.decode_step import decode_stepper
from benchmarks.timing import batched, device_events, timeit, trace_planes


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


def host_summary(title, f, *args, n=10):
    """The host-side trace events of n back-to-back runs: the costliest names."""
    by = {}
    for plane in trace_planes(f, *args, n=n):
        if plane.name.startswith("/host"):
            for line in plane.lines:
                for e in line.events:
                    by.setdefault(e.name[:70], []).append(e.duration_ns)
    print(f"== host events, {title} ({n} runs): total us per run, count per run")
    for name, ds in sorted(by.items(), key=lambda kv: -sum(kv[1]))[:24]:
        print(f"   {sum(ds)/1e3/n:9.1f} us  {len(ds)/n:6.1f}x  {name}")


def main():
    rng = np.random.default_rng(0)
    dt = jnp.bfloat16
    what = sys.argv[1:] or ["decode", "small", "conv", "scan"]

    if "decode" in what or "decode-more" in what:
        W, layers = 4, 32
        for B, D in ((64, 4096), (256, 8192)):
            ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(layers)]
            bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(layers)]
            x = jnp.asarray(rng.standard_normal((B, D)), dt)
            no_graphs = {"xla_gpu_enable_command_buffer": ""}
            variants = [("ffi", None)]
            if "decode-more" in what:
                variants += [("ffi", no_graphs), ("xla", None), ("xla", no_graphs)]
            for backend, opts in variants:
                run = decode_stepper(layers, backend, [jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
                                                       for _ in range(layers)], compiler_options=opts)
                t_sync = timeit(run, x, ws, bs, reps=20)
                t_async = timeit(run, x, ws, bs, reps=7, calls=20)
                tag = f"{backend}{', no command buffers' if opts else ''}"
                print(f"decode B={B} D={D} {tag}: per layer {t_sync*1e6/layers:.2f} us (sync each step), "
                      f"{t_async*1e6/layers:.2f} us (20 steps async)")
                summarize(f"decode B={B} D={D} {tag}, one step", device_events(run, x, ws, bs, n=10), 10)
                if backend == "ffi":  # handler executions: none when command-buffer replays skip them
                    c0 = _ffi._jcc_cuda.handler_calls()
                    for _ in range(20):
                        y = run(x, ws, bs)
                    jax.block_until_ready(y)
                    print(f"   handler executions per step, 20 steps back to back: "
                          f"{(_ffi._jcc_cuda.handler_calls() - c0) / 20:.1f}")
                if opts is None and backend == "ffi":
                    host_summary(f"decode B={B} D={D} {tag}", run, x, ws, bs)
            # yardstick: the same bytes through one XLA elementwise pass per layer
            run = decode_stepper(layers, "negate", [jnp.asarray(rng.standard_normal((B, D, W)), dt)
                                                    for _ in range(layers)])
            summarize(f"decode B={B} D={D} XLA negate of the same bytes, one step",
                      device_events(run, x, ws, bs, n=10), 10)
            host_summary(f"decode B={B} D={D} XLA negate of the same bytes", run, x, ws, bs)

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
        # the loop itself as a CUDA graph (XLA's WHILE command), or no graphs at all
        for opts in ({"xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL,WHILE,CONDITIONAL"},
                     {"xla_gpu_enable_command_buffer": ""}):
            for name in ("ours", "barrier (s, x)"):
                try:
                    f = scan_of(bodies[name]).lower(s0, xs).compile(opts)
                    t = timeit(f, s0, xs, reps=7, calls=3)
                except Exception as e:
                    print(f"scan {name} {opts}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                print(f"scan 256 steps, body {name}, {opts}: {t*1e6/256:.2f} us/step")
                summarize(f"scan body {name} {opts}", device_events(f, s0, xs, n=2), 2 * 256)

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
            if name != "ref":
                host_summary(f"(32,512,1024) {name} batched16", batched(fn), xs, w, b, n=4)

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
