"""``jax-causal-conv bench``: run :func:`jax_causal_conv.bench.run_benchmarks` and
optionally plot time against sequence length.

``run_benchmarks(platform, out_md_path)`` writes the markdown table. For
``--plot`` it should return its measurements as a list of records (dicts), each
naming the implementation, the sequence length and the time, under any of the
keys below, e.g. ``{"impl": "ffi", "L": 4096, "ms": 0.12}``. Extra keys (B, D,
W, dtype, pass...) split the plot into one line per distinct combination.
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
        bench = importlib.import_module("jax_causal_conv.bench")
    except ModuleNotFoundError as e:
        if e.name != "jax_causal_conv.bench":
            raise
        print("jax-causal-conv bench: jax_causal_conv.bench is not available in this "
              f"install ({e}).", file=sys.stderr)
        return 2
    import os
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    records = bench.run_benchmarks(args.platform, args.out)
    print(f"wrote {args.out}")
    if args.plot:
        if not records:
            print("jax-causal-conv bench: run_benchmarks returned no records to plot",
                  file=sys.stderr)
            return 1
        plot(records, args.plot)
        print(f"wrote {args.plot}")
    return 0
