"""``jax-causal-conv bench --quick`` (and ``bench`` without a checkout): a
small wall-clock benchmark that ships in the package.

Ours against the jitted XLA shifted sum (``jax_causal_conv.reference``) and
``lax.conv_general_dilated`` (depthwise, causal padding) at a few widths:
the forward, and a training step that keeps the forward (``jax.vjp``: y and
the gradients with respect to x, weight and bias are all returned, so XLA
cannot drop the forward). Bias and SiLU on; channels-first. Wall time per
call, the median of a few samples of back-to-back calls. Seconds in all.
The repository's ``benchmarks/`` has the full matrix (device time, floors).
"""

from __future__ import annotations

import datetime
import statistics
import sys
import time

WIDTHS = (4, 8, 32)
SHAPES = {"gpu": ((8, 4096, 4096), "bfloat16"), "cpu": ((1, 256, 1024), "float32")}
IMPLS = ("ours", "XLA shifted sum", "lax.conv")


def _lax_conv(x, w, b):
    import jax
    from jax import lax
    W = w.shape[-1]
    y = lax.conv_general_dilated(x, w[:, None, :], (1,), [(W - 1, 0)],
                                 dimension_numbers=("NCH", "OIH", "NCH"),
                                 feature_group_count=x.shape[1])
    return jax.nn.silu(y + b[:, None])


def _impl(name):
    import jax_causal_conv as jcc
    if name == "ours":
        return lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", backend="ffi")
    if name == "XLA shifted sum":
        return lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", backend="xla")
    return _lax_conv


def train_step(f):
    """(x, w, b, g) -> (y, (dx, dw, db)): a training step that keeps the
    forward (y returned beside the grads, so XLA cannot drop it)."""
    import jax

    def step(x, w, b, g):
        y, vjp = jax.vjp(f, x, w, b)
        return y, vjp(g)
    return step


def wall_ms(f, args, budget_s=0.2, min_reps=3):
    """Median ms per call: samples of back-to-back calls (one wait each)."""
    import jax
    jax.block_until_ready(f(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    t = time.perf_counter() - t0
    calls = max(1, int(0.005 / max(t, 1e-9)))      # samples of >= ~5 ms
    reps = max(min_reps, min(15, int(budget_s / max(t * calls, 1e-9))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = f(*args)
        jax.block_until_ready(out)
        ts.append((time.perf_counter() - t0) / calls)
    return statistics.median(ts) * 1e3


def measure(platform, widths=WIDTHS, shape=None, dtype=None, progress=None):
    """[{W, impl, fwd_ms, step_ms}] on `platform` ("cpu" or "gpu")."""
    import jax
    import jax.numpy as jnp
    (B, D, L), dt = SHAPES[platform]
    B, D, L = shape or (B, D, L)
    dt = jnp.dtype(dtype or dt)
    rows = []
    with jax.default_device(jax.devices(platform)[0]):
        k = jax.random.split(jax.random.key(0), 4)
        x = jax.random.normal(k[0], (B, D, L), dt)
        g = jax.random.normal(k[1], (B, D, L), dt)
        b = jax.random.normal(k[2], (D,), dt)
        for W in widths:
            w = (jax.random.normal(k[3], (D, W), jnp.float32) / W ** 0.5).astype(dt)
            for name in IMPLS:
                f = _impl(name)
                fwd = wall_ms(jax.jit(f), (x, w, b))
                step = wall_ms(jax.jit(train_step(f)), (x, w, b, g))
                rows.append(dict(W=W, impl=name, fwd_ms=fwd, step_ms=step))
                if progress is not None:
                    progress.step(f"W={W:3d} {name:16s} forward {fwd:9.3f} ms   "
                                  f"training step {step:9.3f} ms")
    return dict(platform=platform, shape=(B, D, L), dtype=dt.name, rows=rows)


def markdown(res):
    import jax
    dev = jax.devices(res["platform"])[0]
    B, D, L = res["shape"]
    out = [f"### Quick benchmark: {getattr(dev, 'device_kind', res['platform'])}, "
           f"{datetime.date.today().isoformat()}, jax {jax.__version__}", "",
           f"(B, D, L) = ({B}, {D}, {L}), {res['dtype']}, channels-first, bias and SiLU. Wall "
           "time per call (median of samples of back-to-back calls). Training step = forward "
           "and gradients with respect to x, weight and bias, y returned too (`jax.vjp`). "
           "'vs ours' = that row's time / ours (forward / step).", "",
           "| W | impl | forward ms | training step ms | vs ours |", "|---:|---|---:|---:|---:|"]
    ours = {r["W"]: r for r in res["rows"] if r["impl"] == "ours"}
    for r in res["rows"]:
        o = ours.get(r["W"])
        ratio = ("" if o is None or o is r else
                 f"{r['fwd_ms'] / o['fwd_ms']:.2f}x / {r['step_ms'] / o['step_ms']:.2f}x")
        out.append(f"| {r['W']} | {r['impl']} | {r['fwd_ms']:.3f} | {r['step_ms']:.3f} | {ratio} |")
    return "\n".join(out) + "\n"


def run(args) -> int:
    from .bench_options import emit
    from .progress import Progress
    with Progress(len(WIDTHS) * len(IMPLS), "quick bench") as p:
        res = measure(args.platform, progress=p)
    emit(markdown(res), getattr(args, "output", None), f"{args.platform}-quick")
    if getattr(args, "plot", None):
        print("bench --quick: no plot (the width plot comes from the full matrix, in a "
              "checkout)", file=sys.stderr)
    return 0
