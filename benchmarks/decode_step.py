"""Decode as a serving loop runs it: a jitted 32-layer step, per layer,
against the same-bytes elementwise yardstick, both state layouts; and a
``lax.scan`` of single-token updates against an empty scan.

    python -m benchmarks.decode_step --platform gpu --output docs/benchmarks.md

One jitted step updates every layer's donated state for one new token, the
parameters passed as arguments. Timed with steps dispatched back to back
(the host keeps the device fed), with a wait after each step (host dispatch
of ~100 arguments included), and, on a GPU, as device time (the kernels'
busy time from the profiler). The wall times of one size are taken in
rounds, one sample of each implementation a round, so that the host's
drifting load falls on all of them alike. The yardstick step replaces each update by
one XLA elementwise pass over the bytes an update reads and writes: a
donated (B, D, W) array per layer (the state plus a slot for the token;
(B, W, D) channels-last) negated in place while x passes through. Negating
x itself in each layer would not do: XLA folds the 32 negations of the x
chain into one kernel, leaving 3/4 of the bytes per layer.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc
from jax_causal_conv.cli.bench_options import add_arguments, resolve_platform
from jax_causal_conv.cli.progress import Progress

from .report import emit, heading, md_table, run_meta
from .timing import device_times, timeit_interleaved, timeit_pair

LAYERS, WIDTH = 32, 4
SIZES = {"gpu": ((1, 4096), (64, 4096), (256, 4096), (256, 8192)),
         "cpu": ((1, 512), (8, 512), (32, 512), (32, 1024))}
IMPLS = (("ours", "ffi"), ("jnp update (reference)", "xla"),
         ("XLA negate, same bytes (yardstick)", "negate"))
LAYOUT_NAMES = {False: "channels-first (B, D, W-1)", True: "channels-last (B, W-1, D)"}


def channels_last_problem(platform):
    """None when ``causal_conv1d_update(..., channels_last=True)`` runs our
    kernel here; else why not (it is being landed)."""
    if "channels_last" not in inspect.signature(jcc.causal_conv1d_update).parameters:
        return "causal_conv1d_update has no channels_last argument in this build yet"
    try:
        with jax.default_device(jax.devices(platform)[0]):
            x = jnp.ones((2, 8), jnp.float32)
            s = jnp.ones((2, WIDTH - 1, 8), jnp.float32)
            w = jnp.ones((8, WIDTH), jnp.float32)
            jax.block_until_ready(jcc.causal_conv1d_update(x, s, w, channels_last=True,
                                                           backend="ffi"))
    except Exception as e:  # the kernels do not have it yet
        return f"channels_last=True fails here ({type(e).__name__}: {str(e).splitlines()[0]})"
    return None


def decode_stepper(layers, backend, states, compiler_options=None, channels_last=False):
    """run(x, ws, bs) -> y: one jitted decode step through `layers` layers
    (SiLU), the states held here and donated to each step; compiled with
    `compiler_options` (XLA debug options) when given. backend "negate": the
    yardstick (see the module docstring). Every backend's step keeps all its
    arguments (keep_unused), so the yardstick, which ignores the weights,
    dispatches as many arguments as the others."""
    cl = {"channels_last": True} if channels_last else {}

    @functools.partial(jax.jit, donate_argnums=(0,), keep_unused=True)
    def step(states, x, ws, bs):
        new = []
        for layer in range(layers):
            if backend == "negate":
                s = -states[layer]
            else:
                x, s = jcc.causal_conv1d_update(x, states[layer], ws[layer], bs[layer],
                                                activation="silu", backend=backend, **cl)
            new.append(s)
        return new, x

    box = [states, None]

    def run(x, ws, bs):
        if box[1] is None:
            box[1] = step.lower(box[0], x, ws, bs).compile(compiler_options) if compiler_options else step
        box[0], y = box[1](box[0], x, ws, bs)
        return y
    return run


def bench_decode(platform, sizes=None, layouts=(False, True), layers=LAYERS, W=WIDTH, log=print,
                 progress=None):
    """Rows {what, layout, impl, async_us, sync_us, dev_us (GPU)} per layer,
    and notes (a layout skipped, and why)."""
    gpu = platform == "gpu"
    rows, notes = [], []
    rng = np.random.default_rng(1)
    dt = jnp.bfloat16
    for cl in layouts:
        if cl:
            why = channels_last_problem(platform)
            if why:
                notes.append(f"Channels-last state not measured: {why}.")
                log(f"decode channels-last skipped: {why}")
                continue
        for B, D in sizes or SIZES[platform]:
            ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(layers)]
            bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(layers)]
            x = jnp.asarray(rng.standard_normal((B, D)), dt)
            runs = {}
            for impl, backend in IMPLS:
                H = W if backend == "negate" else W - 1  # the yardstick's state holds the token too
                shape = (B, H, D) if cl else (B, D, H)
                runs[impl] = decode_stepper(layers, backend, [jnp.asarray(rng.standard_normal(shape), dt)
                                                              for _ in range(layers)],
                                            channels_last=cl and backend != "negate")
                jax.block_until_ready(runs[impl](x, ws, bs))
            # in rounds, one sample of each impl a round: the host's load
            # drifts between runs, and these steps are host-bound
            progs = {impl: (run, (x, ws, bs), 1) for impl, run in runs.items()}
            t_async = timeit_interleaved(progs, reps=15, min_sample_s=0.02 if gpu else 0.0)
            t_sync = timeit_interleaved(progs, reps=50)
            dev = device_times({impl: (run, (x, ws, bs), 1) for impl, run in runs.items()},
                               n=10, log=log) if gpu else {}
            for impl, _ in IMPLS:
                row = dict(what=f"{layers}-layer step, B={B} D={D}", layout=LAYOUT_NAMES[cl],
                           impl=impl, async_us=t_async[impl] * 1e6 / layers,
                           sync_us=t_sync[impl] * 1e6 / layers)
                if gpu:
                    row["dev_us"] = dev[impl] / layers if dev.get(impl) else None
                rows.append(row)
                line = (f"decode {row['layout']} B={B} D={D} {impl}: per layer "
                        f"{row['async_us']:.2f} us back to back, {row['sync_us']:.2f} us waiting"
                        + (f", device {row['dev_us']:.2f} us" if row.get("dev_us") else ""))
                if progress is not None:
                    progress.step(line)
                else:
                    log(line)
    return rows, notes


def bench_scan(platform, B, D, W=WIDTH, steps=256):
    """A lax.scan of `steps` one-token updates (ours) and of the yardstick
    body, each timed in alternation with the same scan with an empty body."""
    rng = np.random.default_rng(2)
    dt = jnp.bfloat16
    xs = jnp.asarray(rng.standard_normal((steps, B, D)), dt)
    s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)

    def scan_of(body):
        return jax.jit(lambda s, xs: lax.scan(body, s, xs))

    def ours(s, x):
        y, s = jcc.causal_conv1d_update(x, s, w, b, activation="silu")
        return s, y

    # XLA deletes a loop whose body does nothing; the barrier keeps the loop
    # (and its per-step cost) with no work in the body. The loops are
    # host-driven, so each is timed in alternation with the empty one.
    empty = scan_of(lambda s, x: lax.optimization_barrier((s, x)))
    t_o, t_e, t_add = timeit_pair(scan_of(ours), empty, (s0, xs), reps=25, calls=3)
    a0 = jnp.asarray(rng.standard_normal((B, D, W)), dt)
    t_y, t_ye, t_yadd = timeit_pair(scan_of(lambda a, x: lax.optimization_barrier((-a, x))), empty,
                                    (a0, xs), reps=25, calls=3)
    us = 1e6 / steps
    return dict(what=f"lax.scan of {steps} one-token steps, B={B} D={D}",
                ours_us=t_o * us, empty_us=t_e * us, adds_us=t_add * us,
                yard_us=t_y * us, yard_empty_us=t_ye * us, yard_adds_us=t_yadd * us)


def markdown(meta, rows, notes, scan):
    dev = any(r.get("dev_us") is not None for r in rows)
    out = [heading(meta, "Decode step"), "",
           "bf16, W=4, SiLU, bias. One jitted step updates every layer's donated state for one "
           "new token, parameters passed as arguments. 'back to back': steps dispatched without "
           "waiting (as a serving loop keeps the device fed); 'waiting': a wait after each step, "
           "host dispatch included" + ("; 'device': GPU busy time from the profiler" if dev else "")
           + ". The yardstick replaces each update by one XLA elementwise pass over the bytes an "
           "update reads and writes (a donated (B, D, W) array per layer, the state plus a slot "
           "for the token, negated in place; x passes through). 'vs yardstick' = that row / the "
           "yardstick, back to back" + (" (device time in parentheses)" if dev else "") + ".", ""]
    header = ["decode step", "state layout", "impl", "us/layer back to back", "us/layer waiting"]
    header += ["us/layer device"] if dev else []
    header.append("vs yardstick")
    yard = {(r["what"], r["layout"]): r for r in rows if "yardstick" in r["impl"]}
    table = []
    for r in rows:
        y = yard.get((r["what"], r["layout"]))
        ratio = ""
        if y and y is not r:
            ratio = f"{r['async_us'] / y['async_us']:.2f}x"
            if dev and r.get("dev_us") and y.get("dev_us"):
                ratio += f" ({r['dev_us'] / y['dev_us']:.2f}x)"
        row = [r["what"], r["layout"], r["impl"], f"{r['async_us']:.2f}", f"{r['sync_us']:.2f}"]
        row += [f"{r['dev_us']:.2f}" if r.get("dev_us") is not None else "—"] if dev else []
        table.append(row + [ratio])
    out += md_table(header, table, right=range(3, len(header)))
    out += [""] + notes + ([""] if notes else [])
    if scan:
        out += [f"{scan['what']} (channels-first state): ours {scan['ours_us']:.2f} us per step; "
                f"the same scan with an empty body (kept by `lax.optimization_barrier`) "
                f"{scan['empty_us']:.2f} us; ours adds {scan['adds_us']:.2f} us per step (median "
                f"of the differences of 25 alternating samples, 3 scans each). The yardstick "
                f"body (the empty body plus one XLA pass negating a (B, D, W) carry, the bytes "
                f"an update moves), timed the same way: {scan['yard_us']:.2f} us per step "
                f"against {scan['yard_empty_us']:.2f}, adds {scan['yard_adds_us']:.2f} us."]
    return "\n".join(out) + "\n"


def run_decode(platform, output=None, sizes=None, with_scan=True):
    sizes = sizes or SIZES[platform]
    layouts = (False,) if channels_last_problem(platform) else (False, True)
    with jax.default_device(jax.devices(platform)[0]), \
            Progress(len(sizes) * len(IMPLS) * len(layouts), f"decode ({platform})") as p:
        meta = run_meta(platform)
        rows, notes = bench_decode(platform, sizes=sizes, layouts=(False, True), log=p.log,
                                   progress=p)
        scan = None
        if with_scan:
            B, D = sizes[1] if len(sizes) > 1 else sizes[0]
            scan = bench_scan(platform, B, D)
            p.log(f"scan: ours {scan['ours_us']:.2f} us/step, adds {scan['adds_us']:.2f}; "
                  f"yardstick adds {scan['yard_adds_us']:.2f}")
    text = markdown(meta, rows, notes, scan)
    emit(text, output, f"{platform}-decode")
    return text


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_step",
                                description=__doc__.split("\n\n")[0])
    add_arguments(p, suite=False, matrix=False, plot=False)
    p.add_argument("--sizes", metavar="BxD,..", help="batch x dim pairs, e.g. 64x4096,256x8192")
    p.add_argument("--no-scan", action="store_true", help="leave out the lax.scan measurement")
    args = p.parse_args(argv)
    try:
        platform = resolve_platform(args.platform)
        sizes = ([tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
                 if args.sizes else None)
    except (SystemExit, ValueError) as e:
        print(f"decode_step: {e}", file=sys.stderr)
        return 2
    run_decode(platform, args.output, sizes, with_scan=not args.no_scan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
