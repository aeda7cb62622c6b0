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
import re
import sys

SECTIONS = ("matrix", "decode", "baselines", "torch")
CUDA_FIX = 'pip install "jax[cuda13]" (or "jax[cuda12]"), then reinstall jax-causal-conv with nvcc on PATH'


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


def gpu_problem():
    """None when JAX sees a GPU and our CUDA kernels are loaded; else one
    sentence saying which is missing and how to fix it."""
    import jax

    from .._lowering import targets
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    kernels = "cuda" in targets.PLATFORMS
    err = targets.CUDA_IMPORT_ERROR or ""
    # A build without nvcc has no _jcc_cuda at all; Python's message for that
    # ("partially initialized module ...") would mislead.
    why = ("this installation has no CUDA module (it was built without nvcc)"
           if not err or "cannot import name '_jcc_cuda'" in err else err)
    if gpus and kernels:
        return None
    if not gpus and not kernels:
        return (f"JAX sees no GPU (jax {jax.__version__}, backend {jax.default_backend()}) and "
                f"our CUDA kernels are not loaded ({why}); fix: {CUDA_FIX}.")
    if not gpus:
        return (f"JAX sees no GPU (jax {jax.__version__}, backend {jax.default_backend()}; "
                f"our CUDA kernels are built); fix: {CUDA_FIX.split(', then')[0]}.")
    return (f"JAX sees {gpus[0].device_kind} but our CUDA kernels are not loaded ({why}); "
            "fix: reinstall jax-causal-conv with nvcc (the CUDA toolkit) on PATH.")


def resolve_platform(platform):
    """'auto' / 'cpu' / 'gpu' -> 'cpu' or 'gpu'; SystemExit with one clear
    sentence when the GPU was asked for and cannot be used."""
    import jax
    if platform in (None, "auto"):
        return "gpu" if jax.default_backend() in ("gpu", "cuda") else "cpu"
    if platform in ("gpu", "cuda"):
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
