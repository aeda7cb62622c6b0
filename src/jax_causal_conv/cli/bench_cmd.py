"""``jax-causal-conv bench``: run :func:`jax_causal_conv.bench.run_benchmarks`
(which writes the markdown tables) and, with ``--plot``, sweep the sequence
length for our kernel and the XLA baselines and plot time against it.

Plotting takes records (dicts) naming the implementation, the sequence length and
the time under any of the keys below, e.g. ``{"impl": "ours", "L": 4096, "ms":
0.12}``; other keys (pass, dtype...) split the plot into one line per combination.
"""

from __future__ import annotations

import sys

IMPL_KEYS = ("impl", "implementation", "name", "method", "backend")
LEN_KEYS = ("L", "seqlen", "seq_len", "length")
TIME_KEYS = ("ms", "time_ms", "median_ms", "us", "time_us", "median_us", "s", "time_s")


def add_parser(sub):
    p = sub.add_parser("bench", help="benchmark our kernels against baselines")
    p.add_argument("--platform", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--out", default="docs/benchmarks.md", help="markdown table to write")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="also plot time vs sequence length (needs matplotlib)")
    return p


def _key(rec, keys):
    for k in keys:
        if k in rec:
            return k
    return None


def series(records):
    """Group records into {label: [(L, ms), ...]} sorted by L; raises ValueError
    when the records lack an implementation, length or time field."""
    out = {}
    for rec in records:
        ki, kl, kt = _key(rec, IMPL_KEYS), _key(rec, LEN_KEYS), _key(rec, TIME_KEYS)
        if ki is None or kl is None or kt is None:
            raise ValueError(f"benchmark record has no implementation/length/time field: {rec}")
        scale = 1e-3 if kt.endswith("us") else 1e3 if kt in ("s", "time_s") else 1.0
        extra = ", ".join(f"{k}={v}" for k, v in sorted(rec.items())
                          if k not in (ki, kl, kt) and not isinstance(v, (float, list, dict)))
        label = f"{rec[ki]}" + (f" ({extra})" if extra else "")
        out.setdefault(label, []).append((int(rec[kl]), float(rec[kt]) * scale))
    return {k: sorted(v) for k, v in out.items()}


def _impls():
    from jax import lax

    import jax_causal_conv as jcc

    def lax_conv(x, w, b):  # (B, L, D)
        W = w.shape[-1]
        y = lax.conv_general_dilated(x, w.T[:, None, :], (1,), [(W - 1, 0)],
                                     dimension_numbers=("NWC", "WIO", "NWC"),
                                     feature_group_count=x.shape[-1])
        return y + b

    return {
        "ours": lambda x, w, b: jcc.causal_conv1d(x, w, b, channels_last=True),
        "lax.conv_general_dilated": lax_conv,
        "XLA shifted sum": lambda x, w, b: jcc.reference.causal_conv1d(x, w, b,
                                                                       channels_last=True),
    }


def sweep(platform, lengths=None, B=None, D=None, W=4, dtype=None, reps=None, log=print):
    """Time forward and forward+backward, channels-last, over sequence lengths:
    records {"impl", "L", "pass", "ms"} for :func:`plot`."""
    import statistics
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np

    gpu = platform == "gpu"
    lengths = lengths or ([512, 1024, 2048, 4096, 8192, 16384] if gpu
                          else [256, 512, 1024, 2048, 4096])
    B, D = B or (8 if gpu else 2), D or (4096 if gpu else 512)
    dtype = dtype or (jnp.bfloat16 if gpu else jnp.float32)
    reps = reps or (20 if gpu else 5)
    impls = _impls()
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dtype)
    b = jnp.asarray(rng.standard_normal((D,)), dtype)

    def timeit(f, *args):
        jax.block_until_ready(f(*args))
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*args))
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    records = []
    with jax.default_device(jax.devices(platform)[0]):
        for L in lengths:
            x = jnp.asarray(rng.standard_normal((B, L, D)), dtype)
            g = jnp.asarray(rng.standard_normal((B, L, D)), dtype)
            for name, fn in impls.items():
                fwd = jax.jit(fn)
                # g is an argument, not a closed-over constant XLA would try to fold
                bwd = jax.jit(jax.grad(lambda x, w, b, g, fn=fn: jnp.sum(
                    fn(x, w, b).astype(jnp.float32) * g), argnums=(0, 1, 2)))
                for pas, f, args in (("fwd", fwd, (x, w, b)), ("fwd+bwd", bwd, (x, w, b, g))):
                    ms = timeit(f, *args)
                    records.append({"impl": name, "L": L, "pass": pas, "ms": ms})
                    log(f"  L={L:6d} {name:26s} {pas:8s} {ms:9.4f} ms")
    return records


def plot(records, path, title="causal_conv1d"):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'jax-causal-conv[bench]'")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in series(records).items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("time (ms)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    import importlib
    try:
        bench = importlib.import_module("benchmarks.bench")
    except ModuleNotFoundError as e:
        if e.name not in ("benchmarks", "benchmarks.bench"):
            raise
        print("jax-causal-conv bench: the benchmarks live in the repository's benchmarks/ "
              f"folder; run this from a checkout ({e}).", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (fail before the benchmarks, not after)
        except ImportError:
            print("--plot needs matplotlib: pip install 'jax-causal-conv[bench]'",
                  file=sys.stderr)
            return 2
    import os
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    import jax
    platform = args.platform
    if platform == "auto":
        platform = "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"
    text = bench.run_benchmarks(platform, args.out)
    if isinstance(text, str):
        print(text)
    print(f"wrote {args.out}")
    if args.plot:
        B = 8 if platform == "gpu" else 2
        D = 4096 if platform == "gpu" else 512
        print(f"sweeping the sequence length for the plot (B={B}, D={D}, W=4, channels last)")
        records = sweep(platform, B=B, D=D)
        plot(records, args.plot, title=f"causal_conv1d, {platform}, B={B} D={D} W=4")
        print(f"wrote {args.plot}")
    return 0
