"""The benchmark suite: its sections for one platform, in one run; what
``python -m jax_causal_conv bench`` runs from a checkout.

    python -m benchmarks.bench --platform gpu --output docs/benchmarks.md
    python -m benchmarks.bench --sections decode,torch --platform cpu
    python -m benchmarks.bench gpu docs/benchmarks.md     # the older form: what it ran
                                                          # then (decode, baselines, torch)

Sections (each also runs alone as its module):
- matrix:    conv_matrix.py, every width x layout x mode against floors and
             the XLA shifted sum (the long one: filters split it);
- decode:    decode_step.py, the 32-layer decode step and the scan;
- baselines: baselines.py, W=4 against lax.conv, the XLA shifted sum, Flax;
- torch:     bench_torch.py, the torch adapter against F.conv1d.
Markdown to stdout, or into --output between per-section markers.
"""

from __future__ import annotations

import argparse
import sys

from jax_causal_conv.cli.bench_options import SECTIONS, add_arguments, resolve_platform

from . import matrix_cells as mc
# The probes (benchmarks/probes/) import these helpers from here.
from .decode_step import decode_stepper  # noqa: F401
from .timing import (_block, _sample, batched, device_busy_us, device_events,  # noqa: F401
                     looped, timeit, timeit_pair, trace_planes)


def parse_sections(text):
    if not text:
        return list(SECTIONS)
    out = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in out if s not in SECTIONS]
    if bad:
        raise ValueError(f"--sections: unknown {', '.join(bad)} (expected {', '.join(SECTIONS)})")
    return out


def run_suite(args) -> int:
    """Runs the chosen sections; args as ``bench``'s parser gives them, the
    platform already resolved to 'cpu' or 'gpu'."""
    if getattr(args, "quick", False):
        from jax_causal_conv.cli import quick_bench
        return quick_bench.run(args)
    try:
        sections = parse_sections(getattr(args, "sections", None))
        if "matrix" not in sections:
            used = [f"--{k}" for k in ("widths", "layouts", "modes", "dtypes", "shapes", "parts",
                                       "json") if getattr(args, k, None)]
            if used:
                raise ValueError(f"{', '.join(used)} only apply to the matrix section")
        else:
            from .conv_matrix import parse_filters
            parse_filters(args, args.platform)      # refuse a bad filter before any timing
            mc.parse_list(getattr(args, "parts", None), "parts", mc.PASSES)
    except ValueError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    out = getattr(args, "output", None)
    for s in sections:
        if s == "matrix":
            from .conv_matrix import run_matrix
            run_matrix(args, args.platform)
        elif s == "decode":
            from .decode_step import run_decode
            run_decode(args.platform, out)
        elif s == "baselines":
            from .baselines import run_baselines
            run_baselines(args.platform, out)
        elif s == "torch":
            from .bench_torch import run_torch
            run_torch(args.platform, out)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench",
                                description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("legacy", nargs="*", metavar="[PLATFORM [FILE]]",
                   help="the older form: platform (cpu/gpu) then the markdown file")
    args = p.parse_args(argv)
    if args.legacy:
        if len(args.legacy) > 2 or args.legacy[0] not in ("cpu", "gpu", "cuda", "auto"):
            p.error(f"positional arguments are [PLATFORM [FILE]], got {' '.join(args.legacy)}")
        args.platform = args.legacy[0]
        if len(args.legacy) == 2:
            args.output = args.legacy[1]
        # The older form keeps its old scope and duration (scripts time it
        # out): no matrix unless asked for.
        args.sections = args.sections or "decode,baselines,torch"
    try:
        args.platform = resolve_platform(args.platform)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    return run_suite(args)


if __name__ == "__main__":
    sys.exit(main())
