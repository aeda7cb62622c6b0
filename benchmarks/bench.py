"""Benchmarks: our kernels against XLA baselines, in one run.

    python -m jax_causal_conv.bench [gpu|cpu] [docs/benchmarks.md]

For each shape it times, forward and forward+backward (jax.grad of
sum(y * g) with respect to x, weight and bias): our FFI kernel, jitted
``lax.conv_general_dilated``, the jitted XLA shifted sum
(``jax_causal_conv.reference``) and, channels-last, Flax ``nn.Conv``. A
same-size elementwise pass (``-x``: reads and writes every byte of x once)
measured in the same run is the bandwidth yardstick. Then the decode loop.
The table goes into the markdown file between the platform's markers, and
anything else in that file is kept.
"""

from __future__ import annotations

import datetime
import functools
import math
import re
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_causal_conv as jcc


def _block(out):
    jax.tree.map(lambda a: a.block_until_ready(), out)


def _sample(f, args, calls):
    """Seconds to dispatch f(*args) `calls` times back to back and wait for the last."""
    t0 = time.perf_counter()
    for _ in range(calls):
        out = f(*args)
    _block(out)
    return time.perf_counter() - t0


def timeit(f, *args, reps=50, warmup=5, inner=1, calls=1, min_sample_s=0.0):
    """Median seconds per call of f (already jitted); inner = calls per f.

    Each sample dispatches f `calls` times back to back (asynchronously) and
    waits for the last, so host dispatch and synchronisation are amortised.
    With min_sample_s, `calls` grows until a sample lasts that long: a
    sample's first dispatch and final wait (a few hundred us on a GPU) are
    then a small share of it, for every impl alike.
    """
    for _ in range(warmup):
        _block(f(*args))
    if min_sample_s > 0:
        t = _sample(f, args, calls)
        calls = max(calls, math.ceil(calls * min_sample_s / max(t, 1e-9)))
    ts = [_sample(f, args, calls) for _ in range(reps)]
    return statistics.median(ts) / (inner * calls)


def timeit_pair(f, g, args, reps=25, warmup=3, calls=1):
    """Median seconds per call of f and of g, and the median of their
    difference, from samples taken in alternation (f, g, f, g, ...), so that
    drift in host speed over the run falls on both alike."""
    for _ in range(warmup):
        _block(f(*args))
        _block(g(*args))
    tf, tg = [], []
    for _ in range(reps):
        tf.append(_sample(f, args, calls) / calls)
        tg.append(_sample(g, args, calls) / calls)
    return (statistics.median(tf), statistics.median(tg),
            statistics.median([a - b for a, b in zip(tf, tg)]))


def looped(fn, n):
    """Jitted loop of n dependent calls (x -> fn(x))."""
    @jax.jit
    def f(x, *rest):
        return lax.fori_loop(0, n, lambda i, x: fn(x, *rest).astype(x.dtype), x)
    return f


def batched(fn):
    """One jitted program calling fn on each of several inputs (independent
    calls, no loop): for small, launch-bound shapes, the device time per call
    without a host dispatch per call (a loop would add a carry copy for every
    impl that is not fused into the carry update)."""
    @jax.jit
    def f(xs, *rest):
        return [fn(x, *rest) for x in xs]
    return f


def _lax_conv(x, w, b, cl):
    W = w.shape[-1]
    if cl:
        y = lax.conv_general_dilated(x, w.T[:, None, :], (1,), [(W - 1, 0)],
                                     dimension_numbers=("NWC", "WIO", "NWC"),
                                     feature_group_count=x.shape[-1])
        return y + b
    y = lax.conv_general_dilated(x, w[:, None, :], (1,), [(W - 1, 0)],
                                 dimension_numbers=("NCH", "OIH", "NCH"),
                                 feature_group_count=x.shape[1])
    return y + b[:, None]


def _impls(cl):
    impls = {
        "ours": lambda x, w, b: jcc.causal_conv1d(x, w, b, channels_last=cl, backend="ffi"),
        "lax.conv": lambda x, w, b: _lax_conv(x, w, b, cl),
        "XLA shifted sum": lambda x, w, b: jcc.reference.causal_conv1d(x, w, b, channels_last=cl),
    }
    if cl:
        try:
            from flax import linen as nn

            def flax_conv(x, w, b):
                D, W = w.shape
                m = nn.Conv(features=D, kernel_size=(W,), feature_group_count=D, padding="CAUSAL",
                            dtype=x.dtype, param_dtype=w.dtype)
                params = {"params": {"kernel": w.T[:, None, :], "bias": b}}
                return m.apply(params, x)
            impls["flax nn.Conv"] = flax_conv
        except ImportError:
            pass
    return impls


def _grad(fn):
    def loss(x, w, b, g):
        return jnp.sum(fn(x, w, b).astype(jnp.float32) * g)
    return jax.grad(loss, argnums=(0, 1, 2))


def _shapes(platform):
    if platform == "gpu":
        return [((8, 4096, 4096), jnp.bfloat16, False), ((4, 2048, 16384), jnp.bfloat16, False),
                ((8, 4096, 4096), jnp.bfloat16, True), ((8, 4096, 4096), jnp.float32, False),
                ((32, 512, 1024), jnp.bfloat16, False)]
    return [((8, 512, 4096), jnp.float32, False), ((4, 512, 2048), jnp.float32, True),
            ((4, 512, 2048), jnp.bfloat16, False), ((8, 128, 512), jnp.float32, False)]


def add_row(rows, log, name, impl, t_fwd, t_fwdbwd, t_copy):
    """Records one timed implementation (seconds) as a table row, and logs it."""
    rows.append(dict(shape=name, impl=impl, fwd_ms=t_fwd * 1e3, fwdbwd_ms=t_fwdbwd * 1e3,
                     copy_ms=t_copy * 1e3, frac=t_copy / t_fwd))
    log(f"{name:34s} {impl:22s} fwd {t_fwd*1e3:8.4f} ms  fwd+bwd {t_fwdbwd*1e3:8.4f} ms  "
        f"copy {t_copy*1e3:8.4f} ms  ({t_copy / t_fwd:5.1%} of copy bw)")


def bench_conv(platform, W=4, log=print):
    rows = []
    rng = np.random.default_rng(0)
    for (B, D, L), dt, cl in _shapes(platform):
        shape = (B, L, D) if cl else (B, D, L)
        x = jnp.asarray(rng.standard_normal(shape), dt)
        w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
        b = jnp.asarray(rng.standard_normal((D,)), dt)
        g = jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dt)
        nbytes = x.size * x.dtype.itemsize
        small = nbytes < (64 << 20)
        gpu = platform == "gpu"
        # Small shapes: one program of n independent calls on n inputs
        # (batched). Each sample dispatches back to back, on the GPU for at
        # least 20 ms (see timeit).
        n = 16 if (gpu and small) else 1
        calls = 4 if gpu else 1
        reps = 20 if gpu else 5
        span = dict(reps=reps, calls=calls, min_sample_s=0.02 if gpu else 0.0)
        xin, wrap = (tuple(x * (1 + i / n) for i in range(n)), batched) if n > 1 else (x, jax.jit)
        t_copy = timeit(wrap(lambda x, *_: -x), xin, inner=n, **span)
        name = f"({B},{D},{L}) {jnp.dtype(dt).name}{' CL' if cl else ''}"
        for impl, fn in _impls(cl).items():
            try:
                t_f = timeit(wrap(fn), xin, w, b, inner=n, **span)
                bwd = jax.jit(_grad(fn))
                t_b = timeit(bwd, x, w, b, g, **span)
            except Exception as e:  # a baseline that does not run here
                log(f"{name} {impl}: {type(e).__name__}: {e}")
                continue
            add_row(rows, log, name, impl, t_f, t_b, t_copy)
    return rows


def trace_planes(f, *args, n=10):
    """The JAX profiler's planes (host and device timelines) over n
    back-to-back runs of f(*args), after one untraced run; [] when the
    profiler wrote no trace."""
    import glob
    import tempfile
    _block(f(*args))
    d = tempfile.mkdtemp()
    jax.profiler.start_trace(d)
    out = None
    for _ in range(n):
        out = f(*args)
    _block(out)
    jax.profiler.stop_trace()
    paths = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
    return list(jax.profiler.ProfileData.from_file(paths[0]).planes) if paths else []


def device_events(f, *args, n=10):
    """GPU kernels and copies of n back-to-back runs of f(*args), from the JAX
    profiler: a list of (name, start_ns, end_ns) sorted by start; [] where
    the trace has no GPU stream lines (a CPU run)."""
    ev = []
    for plane in trace_planes(f, *args, n=n):
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):  # not the XLA op/module summaries
                    ev.extend((e.name, e.start_ns, e.end_ns) for e in line.events)
    return sorted(ev, key=lambda t: t[1])


def device_busy_us(f, *args, n=10):
    """Microseconds per run of f that the GPU spends executing (kernels and
    copies, gaps excluded); nan without a GPU trace."""
    ev = device_events(f, *args, n=n)
    return sum(e - s for _, s, e in ev) / 1e3 / n if ev else float("nan")


def decode_stepper(layers, backend, states, compiler_options=None):
    """run(x, ws, bs) -> y: one jitted decode step through `layers` layers
    (SiLU), the states held here and donated to each step; compiled with
    `compiler_options` (XLA debug options) when given. backend "negate": the
    yardstick, one XLA elementwise pass per layer over the bytes an update
    reads and writes: each state is then (B, D, W), the width-1 entries plus
    a slot for the token, negated in place, and x passes through. (Negating
    x itself in each layer would not do: XLA folds the 32 negations of the x
    chain into one kernel, leaving 3/4 of the bytes per layer.) Every backend's
    step keeps all its arguments (keep_unused), so the yardstick, which ignores
    the weights, dispatches as many arguments as the others."""
    @functools.partial(jax.jit, donate_argnums=(0,), keep_unused=True)
    def step(states, x, ws, bs):
        new = []
        for l in range(layers):
            if backend == "negate":
                s = -states[l]
            else:
                x, s = jcc.causal_conv1d_update(x, states[l], ws[l], bs[l], activation="silu",
                                                backend=backend)
            new.append(s)
        return new, x

    box = [states, None]

    def run(x, ws, bs):
        if box[1] is None:
            box[1] = step.lower(box[0], x, ws, bs).compile(compiler_options) if compiler_options else step
        box[0], y = box[1](box[0], x, ws, bs)
        return y
    return run


def bench_decode(platform, layers=32, W=4, log=print):
    """Decode as a serving loop runs it: one jitted step updates `layers`
    layers' (donated) states for one new token, the parameters passed as
    arguments. Timed with steps dispatched back to back (the host keeps the
    device fed) and with a wait after each step (host dispatch of ~100
    arguments included); the profiler gives the device time alone."""
    rows = []
    rng = np.random.default_rng(1)
    sizes = [(64, 4096), (256, 8192)] if platform == "gpu" else [(8, 512), (32, 1024)]
    dt = jnp.bfloat16
    for B, D in sizes:
        ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(layers)]
        bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(layers)]
        x = jnp.asarray(rng.standard_normal((B, D)), dt)
        for impl, backend in (("ours", "ffi"), ("jnp update (reference)", "xla"),
                              ("XLA negate, same bytes (yardstick)", "negate")):
            H = W if backend == "negate" else W - 1  # the yardstick's state holds the token too
            run = decode_stepper(layers, backend,
                                 [jnp.asarray(rng.standard_normal((B, D, H)), dt) for _ in range(layers)])
            t_async = timeit(run, x, ws, bs, reps=15, calls=20,
                             min_sample_s=0.02 if platform == "gpu" else 0.0)
            t_sync = timeit(run, x, ws, bs, reps=50)
            t_dev = device_busy_us(run, x, ws, bs) if platform == "gpu" else float("nan")
            rows.append(dict(what=f"{layers}-layer step, B={B} D={D}", impl=impl,
                             async_us=t_async * 1e6 / layers, sync_us=t_sync * 1e6 / layers,
                             dev_us=t_dev / layers))
            log(f"decode B={B} D={D} {impl}: per layer {t_async*1e6/layers:.2f} us back to back, "
                f"{t_sync*1e6/layers:.2f} us waiting each step, device {t_dev/layers:.2f} us")

    B, D = sizes[0]
    steps = 256
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
    # host-driven, so each is timed in alternation with the empty one
    # (timeit_pair). The yardstick body is the empty body plus one XLA pass
    # over the bytes an update moves (a (B, D, W) carry negated).
    empty = scan_of(lambda s, x: lax.optimization_barrier((s, x)))
    t_o, t_e, t_add = timeit_pair(scan_of(ours), empty, (s0, xs), reps=25, calls=3)
    a0 = jnp.asarray(rng.standard_normal((B, D, W)), dt)
    t_y, t_ye, t_yadd = timeit_pair(scan_of(lambda a, x: lax.optimization_barrier((-a, x))), empty,
                                    (a0, xs), reps=25, calls=3)
    scan = dict(what=f"lax.scan of {steps} one-token steps, B={B} D={D}",
                ours_us=t_o * 1e6 / steps, empty_us=t_e * 1e6 / steps, adds_us=t_add * 1e6 / steps,
                yard_us=t_y * 1e6 / steps, yard_empty_us=t_ye * 1e6 / steps, yard_adds_us=t_yadd * 1e6 / steps)
    log(f"scan: {scan['ours_us']:.2f} us/step, empty body {scan['empty_us']:.2f} us/step, "
        f"adds {scan['adds_us']:.2f}; yardstick {scan['yard_us']:.2f}, empty {scan['yard_empty_us']:.2f}, "
        f"adds {scan['yard_adds_us']:.2f}")
    return rows, scan


def _table(rows, ours_impl):
    out = ["| shape (B,D,L) dtype | impl | fwd ms | fwd+bwd ms | copy ms | of copy bw | ours faster |",
           "|---|---|---:|---:|---:|---:|---:|"]
    ours = {r["shape"]: r for r in rows if r["impl"] == ours_impl}
    for r in rows:
        o = ours.get(r["shape"])
        ratio = ("" if o is None or r is o else
                 f"{r['fwd_ms'] / o['fwd_ms']:.2f}x / {r['fwdbwd_ms'] / o['fwdbwd_ms']:.2f}x")
        out.append(f"| {r['shape']} | {r['impl']} | {r['fwd_ms']:.4f} | {r['fwdbwd_ms']:.4f} | "
                   f"{r['copy_ms']:.4f} | {r['frac']:.1%} | {ratio} |")
    return out


def _markdown(platform, conv, decode, torch_rows=()):
    dev = jax.devices(platform)[0]
    kind = getattr(dev, "device_kind", platform)
    today = datetime.date.today().isoformat()
    out = [f"### {platform.upper()}: {kind}, {today}, jax {jax.__version__}", "",
           "Median times. 'copy' is a same-size `-x` pass measured in the same run "
           "(each byte of x read and written once); 'of copy bw' = copy time / forward time. "
           "fwd+bwd is `jax.grad` of `sum(y * g)` w.r.t. x, weight, bias (the value of y "
           "is not needed, so XLA drops the forward, for every impl alike). Width 4. "
           + ("Each sample dispatches calls back to back for at least 20 ms, then waits "
              "(the first dispatch and the final wait are then a small share of it). "
              "Shapes under 64 MiB: 16 independent calls on 16 inputs in one jitted "
              "program, time per call. "
              if platform == "gpu" else ""), "",
           "'ours faster' = that row's time / ours, same shape, same run (fwd / fwd+bwd).", ""]
    out += _table(conv, "ours")
    if torch_rows:
        out += ["", "PyTorch, same run: our kernels through `jax_causal_conv.torch` (DLPack) "
                "against `F.conv1d(groups=D)`.", ""]
        out += _table(list(torch_rows), "torch adapter (ours)")
    rows, scan = decode
    out += ["", "Decode (bf16, W=4, SiLU): one jitted step updates every layer's donated state for "
            "one new token, parameters passed as arguments. 'back to back': steps dispatched "
            "without waiting (as a serving loop keeps the device fed); 'waiting': a wait after "
            "each step, host dispatch included; 'device': GPU busy time from the profiler. "
            "The yardstick row replaces each update by one XLA elementwise pass over the bytes "
            "an update reads and writes (a donated (B, D, W) array per layer, the state plus a "
            "slot for the token, negated in place; x passes through): one kernel per layer "
            "reading and writing the same bytes (W values per row and channel each way).", "",
            "| decode step | impl | us/layer back to back | us/layer waiting | us/layer device |",
            "|---|---|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['what']} | {r['impl']} | {r['async_us']:.2f} | {r['sync_us']:.2f} | "
                   f"{r['dev_us']:.2f} |")
    out += ["", f"{scan['what']}: ours {scan['ours_us']:.2f} us per step; the same scan with "
            f"an empty body (kept by `lax.optimization_barrier`) {scan['empty_us']:.2f} us; "
            f"ours adds {scan['adds_us']:.2f} us per step (median of the differences of "
            f"25 alternating samples, 3 scans each). The yardstick body (the empty body plus "
            f"one XLA pass negating a (B, D, W) carry, the bytes an update moves), timed the same "
            f"way: {scan['yard_us']:.2f} us per step against {scan['yard_empty_us']:.2f}, "
            f"adds {scan['yard_adds_us']:.2f} us."]
    return "\n".join(out) + "\n"


def write_section(path, platform, text):
    start, end = f"<!-- {platform}-bench:start -->", f"<!-- {platform}-bench:end -->"
    try:
        with open(path) as f:
            doc = f.read()
    except FileNotFoundError:
        doc = "# Benchmarks\n"
    block = f"{start}\n{text}{end}"
    if start in doc and end in doc:
        doc = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(doc)


def run_benchmarks(platform, out_md_path):
    """Time everything for `platform` ("gpu" or "cpu") and write its section."""
    platform = "gpu" if platform in ("gpu", "cuda") else "cpu"
    with jax.default_device(jax.devices(platform)[0]):
        conv = bench_conv(platform)
        decode = bench_decode(platform)
    from benchmarks.bench_torch import torch_benchmarks  # [] without torch
    torch_rows = torch_benchmarks("cuda" if platform == "gpu" else "cpu")
    text = _markdown(platform, conv, decode, torch_rows)
    write_section(out_md_path, platform, text)
    return text


if __name__ == "__main__":
    plat = sys.argv[1] if len(sys.argv) > 1 else jax.default_backend()
    path = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks.md"
    print(run_benchmarks(plat, path))
