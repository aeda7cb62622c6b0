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


def timeit(f, *args, reps=50, warmup=5, inner=1, calls=1):
    """Median seconds per call of f (already jitted); inner = calls per f.

    Each sample dispatches f `calls` times back to back (asynchronously) and
    waits for the last, so host dispatch and synchronisation are amortised.
    """
    for _ in range(warmup):
        _block(f(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        _block(out)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) / (inner * calls)


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
        # (batched). Large: `calls` back-to-back asynchronous dispatches per
        # sample.
        n = 16 if (gpu and small) else 1
        calls = 10 if gpu else 1
        reps = 20 if gpu else 5
        if n > 1:
            xin = tuple(x * (1 + i / n) for i in range(n))
            wrap, cf = batched, 1
        else:
            xin, wrap, cf = x, jax.jit, calls
        t_copy = timeit(wrap(lambda x, *_: -x), xin, reps=reps, inner=n, calls=cf)
        name = f"({B},{D},{L}) {jnp.dtype(dt).name}{' CL' if cl else ''}"
        for impl, fn in _impls(cl).items():
            try:
                t_f = timeit(wrap(fn), xin, w, b, reps=reps, inner=n, calls=cf)
                bwd = jax.jit(_grad(fn))
                t_b = timeit(bwd, x, w, b, g, reps=reps, calls=calls)
            except Exception as e:  # a baseline that does not run here
                log(f"{name} {impl}: {type(e).__name__}: {e}")
                continue
            add_row(rows, log, name, impl, t_f, t_b, t_copy)
    return rows


def bench_decode(platform, layers=32, W=4, log=print):
    rows = []
    rng = np.random.default_rng(1)
    sizes = [(64, 4096), (256, 8192)] if platform == "gpu" else [(8, 512), (32, 1024)]
    dt = jnp.bfloat16
    for B, D in sizes:
        # the parameters are arguments, as in a serving loop
        ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(layers)]
        bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(layers)]
        x = jnp.asarray(rng.standard_normal((B, D)), dt)
        states = [jnp.asarray(rng.standard_normal((B, D, W - 1)), dt) for _ in range(layers)]

        @functools.partial(jax.jit, donate_argnums=(0,))
        def step(states, x, ws, bs):
            new = []
            for l in range(layers):
                x, s = jcc.causal_conv1d_update(x, states[l], ws[l], bs[l], activation="silu")
                new.append(s)
            return new, x

        for _ in range(5):
            states, y = step(states, x, ws, bs)
        _block(states)
        ts = []
        for _ in range(50):
            t0 = time.perf_counter()
            states, y = step(states, x, ws, bs)
            _block((states, y))
            ts.append(time.perf_counter() - t0)
        t = statistics.median(ts)
        rows.append(dict(what=f"decode step, {layers} layers, B={B} D={D}", total_us=t * 1e6,
                         per_layer_us=t * 1e6 / layers))
        log(f"decode B={B} D={D}: {t*1e6:.1f} us/step, {t*1e6/layers:.2f} us/layer")

    B, D = sizes[0]
    steps = 256
    xs = jnp.asarray(rng.standard_normal((steps, B, D)), dt)
    s0 = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)

    @jax.jit
    def scan_ours(s, xs):
        def body(s, x):
            y, s = jcc.causal_conv1d_update(x, s, w, b, activation="silu")
            return s, y
        return lax.scan(body, s, xs)

    @jax.jit
    def scan_empty(s, xs):
        return lax.scan(lambda s, x: (s, x), s, xs)

    @jax.jit
    def update_loop(s, x):
        def body(i, c):
            y, s = c
            return jcc.causal_conv1d_update(y, s, w, b, activation="silu")
        return lax.fori_loop(0, 100, body, (x, s))

    t_u = timeit(update_loop, s0, xs[0], reps=30) / 100
    rows.append(dict(what=f"one update call inside a jitted fori_loop (x100), B={B} D={D}",
                     total_us=t_u * 1e6, per_layer_us=t_u * 1e6))
    log(f"update in fori_loop: {t_u*1e6:.2f} us/call")
    t_o = timeit(scan_ours, s0, xs, reps=30)
    t_e = timeit(scan_empty, s0, xs, reps=30)
    rows.append(dict(what=f"lax.scan of {steps} one-token steps, B={B} D={D}", total_us=t_o * 1e6,
                     per_layer_us=t_o * 1e6 / steps, empty_us=t_e * 1e6))
    log(f"scan {steps} steps: {t_o*1e6:.1f} us ({t_o*1e6/steps:.2f} us/step); empty scan {t_e*1e6:.1f} us")
    return rows


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
           + ("Shapes under 64 MiB: 16 independent calls on 16 inputs in one jitted "
              "program, time per call. " if platform == "gpu" else "")
           + "Decode steps: parameters are arguments, the state is donated, "
           "and each step is waited for (host dispatch included).", "",
           "'ours faster' = that row's time / ours, same shape, same run (fwd / fwd+bwd).", ""]
    out += _table(conv, "ours")
    if torch_rows:
        out += ["", "PyTorch, same run: our kernels through `jax_causal_conv.torch` (DLPack) "
                "against `F.conv1d(groups=D)`.", ""]
        out += _table(list(torch_rows), "torch adapter (ours)")
    out += ["", "| decode (bf16, W=4, silu) | total us | us per layer/step | empty scan us |",
            "|---|---:|---:|---:|"]
    for r in decode:
        out.append(f"| {r['what']} | {r['total_us']:.1f} | {r['per_layer_us']:.2f} | "
                   f"{r.get('empty_us', float('nan')):.1f} |")
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
    from .bench_torch import torch_benchmarks  # [] without torch
    torch_rows = torch_benchmarks("cuda" if platform == "gpu" else "cpu")
    text = _markdown(platform, conv, decode, torch_rows)
    write_section(out_md_path, platform, text)
    return text


if __name__ == "__main__":
    plat = sys.argv[1] if len(sys.argv) > 1 else jax.default_backend()
    path = sys.argv[2] if len(sys.argv) > 2 else "docs/benchmarks.md"
    print(run_benchmarks(plat, path))
