"""``jax-causal-conv bench``: benchmarks, printed as markdown.

Two tiers:

- In a checkout of the repository (the ``benchmarks/`` folder next to
  ``src/``, or importable), ``bench`` runs the benchmark suite
  (``benchmarks/bench.py``): the conv matrix against floors and the XLA
  shifted sum, the decode step, the W=4 baselines and PyTorch.
- Installed from a wheel (no ``benchmarks/``), and with ``--quick``
  anywhere, it runs the small wall-clock benchmark that ships in the package
  (``cli/quick_bench.py``): ours against the XLA shifted sum and
  ``lax.conv_general_dilated`` at a few widths, in seconds.

Markdown goes to stdout, or with ``--output FILE`` into FILE between
markers (the rest of FILE is kept). Progress goes to stderr.
"""

from __future__ import annotations

import os
import sys

from .bench_options import add_arguments, resolve_platform


def add_parser(sub):
    p = sub.add_parser(
        "bench", help="benchmark our kernels against baselines (markdown)",
        description="Benchmarks, printed as markdown (or written into --output between "
                    "markers). From a checkout: the full suite in benchmarks/ (conv matrix "
                    "against floors and the XLA shifted sum, decode step, baselines, PyTorch). "
                    "Installed from a wheel, or with --quick: a small wall-clock benchmark "
                    "that ships in the package, in seconds.")
    add_arguments(p)
    return p


def find_suite():
    """The repository's benchmark suite module (benchmarks.bench), or None
    outside a checkout. Looks on sys.path, then in the checkout that holds
    this package (src/jax_causal_conv -> the repository root)."""
    import importlib
    for attempt in range(2):
        try:
            return importlib.import_module("benchmarks.bench")
        except ModuleNotFoundError as e:
            if e.name not in ("benchmarks", "benchmarks.bench"):
                raise
        if attempt == 0:
            here = os.path.dirname(os.path.abspath(__file__))
            root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
            if not os.path.isfile(os.path.join(root, "benchmarks", "bench.py")):
                return None
            sys.path.insert(0, root)
            sys.modules.pop("benchmarks", None)
    return None


CHECKOUT_ONLY = ("sections", "json", "widths", "layouts", "modes", "dtypes", "shapes", "parts")


def run(args) -> int:
    try:
        args.platform = resolve_platform(args.platform)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    suite = None if args.quick else find_suite()
    if suite is None:
        used = [f"--{k}" for k in CHECKOUT_ONLY if getattr(args, k, None)]
        if used:
            print(f"bench: {', '.join(used)} need the repository's benchmarks/ folder (run from a "
                  "checkout); without them, bench runs the packaged quick benchmark.",
                  file=sys.stderr)
            return 2
        if not args.quick:
            print("bench: no benchmarks/ folder here (an installed package): running the quick "
                  "wall-clock benchmark; the full suite runs from a checkout.", file=sys.stderr)
        from . import quick_bench
        return quick_bench.run(args)
    return suite.run_suite(args)
