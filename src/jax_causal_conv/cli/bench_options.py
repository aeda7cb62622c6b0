"""The options of ``bench`` and where its markdown goes, shared by the
command (bench_cmd.py), the packaged quick benchmark (quick_bench.py) and
the repository's benchmark suite (``benchmarks/``), which reuse them."""

from __future__ import annotations

import os
import re
import sys

SECTIONS = ("matrix", "decode", "baselines", "torch")


def add_arguments(p, suite=True, matrix=True, plot=True):
    """The options of ``bench``; the benchmark modules reuse them."""
    p.add_argument("--platform", choices=["auto", "cpu", "gpu"], default="auto",
                   help="where to run (default: the GPU when JAX sees one)")
    p.add_argument("--output", metavar="FILE",
                   help="write the markdown into FILE between markers, keeping the rest "
                        "(default: print it)")
    if plot:
        p.add_argument("--plot", metavar="FILE.png",
                       help="plot of time against width (needs matplotlib); default with "
                            "--output: next to it")
    if suite:
        p.add_argument("--quick", action="store_true",
                       help="the small wall-clock benchmark that ships in the package (seconds)")
        p.add_argument("--sections", metavar="LIST",
                       help=f"checkout only: which of {','.join(SECTIONS)} to run (default all)")
    if matrix:
        p.add_argument("--json", metavar="FILE",
                       help="checkout only: append the matrix cells to FILE (partial runs "
                            "merge; --render turns them into markdown)")
        g = p.add_argument_group("matrix filters (checkout only; comma-separated)")
        g.add_argument("--widths", metavar="W,..", help="e.g. 4,8,64")
        g.add_argument("--layouts", metavar="L,..", help="cf (channels-first), cl (channels-last)")
        g.add_argument("--modes", metavar="M,..", help="dense, seq_idx, states")
        g.add_argument("--dtypes", metavar="D,..", help="bf16, f32")
        g.add_argument("--shapes", metavar="S,..", help="BxDxL, or big / small")
        g.add_argument("--parts", metavar="P,..",
                       help="fwd, bwd (backward alone), step (training step keeping y)")
    return p


def resolve_platform(platform):
    """'auto' / 'cpu' / 'gpu' -> 'cpu' or 'gpu'; SystemExit with one clear
    sentence when the GPU was asked for and cannot be used."""
    import jax
    if platform in (None, "auto"):
        return "gpu" if jax.default_backend() in ("gpu", "cuda") else "cpu"
    if platform in ("gpu", "cuda"):
        from .gpu_status import gpu_problem
        problem = gpu_problem()
        if problem:
            raise SystemExit(f"bench --platform gpu: {problem}")
        return "gpu"
    return "cpu"


def write_section(path, marker, text):
    """Puts `text` between ``<!-- marker:start -->`` and ``<!-- marker:end -->``
    in the markdown file `path` (created if absent), keeping the rest."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    try:
        with open(path) as f:
            doc = f.read()
    except FileNotFoundError:
        doc = "# Benchmarks\n"
    block = f"{start}\n{text.rstrip()}\n{end}"
    if start in doc and end in doc:
        doc = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
    else:
        doc = doc.rstrip("\n") + "\n\n" + block + "\n"
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        f.write(doc)


def emit(text, output, marker):
    """Markdown to stdout, or into `output` between `marker`'s markers."""
    if output:
        write_section(output, marker, text)
        print(f"wrote {marker} into {output}", file=sys.stderr)
    else:
        sys.stdout.write(text.rstrip() + "\n\n")
        sys.stdout.flush()
