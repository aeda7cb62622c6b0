"""Dao-AILab's causal-conv1d as a baseline on a GPU machine without network:
its source tree (a clone kept outside git, `.baselines/causal-conv1d` by
default, carried to the machine with the working tree) compiled for the
local GPU's architecture only, then importable as ``causal_conv1d``.

    # here, once: a copy of the source (any clone will do)
    mkdir -p .baselines/causal-conv1d && git -C <clone> archive HEAD | tar -x -C .baselines/causal-conv1d
    # on the GPU machine (the run's `carry` names .baselines):
    python -m benchmarks.dao_baseline                      # build, print its version
    python -m benchmarks.torch_overhead --device cuda --dao .baselines/causal-conv1d

Nothing of it is copied into this project: it is compiled and imported as
it is, to be measured against.
"""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_SRC = ".baselines/causal-conv1d"
_SOURCES = ("causal_conv1d.cpp", "causal_conv1d_fwd.cu", "causal_conv1d_bwd.cu", "causal_conv1d_update.cu")


def load(src: str = DEFAULT_SRC):
    """Builds (cached under src/build-<arch>) and imports the package."""
    src = os.path.abspath(src)
    if not os.path.isdir(os.path.join(src, "csrc")):
        raise SystemExit(f"dao_baseline: no causal-conv1d source tree at {src}")
    import torch
    from torch.utils.cpp_extension import load as load_extension

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    # (JCC_DAO_BUILD: a build directory outside the carried tree, kept on a warm machine)
    build = os.environ.get("JCC_DAO_BUILD") or os.path.join(src, f"build-{arch}")
    os.makedirs(build, exist_ok=True)
    # the flags of its own setup.py, for one architecture
    ext = load_extension(
        name="causal_conv1d_cuda", sources=[os.path.join(src, "csrc", f) for f in _SOURCES],
        extra_cflags=["-O3"], build_directory=build, verbose=False,
        extra_cuda_cflags=["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                           "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                           "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
                           "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math",
                           f"-gencode=arch=compute_{arch},code=sm_{arch}"])
    sys.modules["causal_conv1d_cuda"] = ext  # (load() imports it without registering the name)
    sys.path.insert(0, src)
    import causal_conv1d
    return causal_conv1d


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", nargs="?", default=DEFAULT_SRC, help=f"its source tree (default {DEFAULT_SRC})")
    mod = load(p.parse_args(argv).src)
    print(f"causal_conv1d {getattr(mod, '__version__', '?')} built and imported from {mod.__file__}")


if __name__ == "__main__":
    main()
