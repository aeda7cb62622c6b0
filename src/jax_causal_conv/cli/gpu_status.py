"""Can our CUDA kernels run here? Two separate questions, each with its fix:
does JAX see a GPU (a CUDA build of jaxlib, a driver, a device), and is our
CUDA module built into this install and loaded.

``diagnose()`` answers both; ``gpu_problem()`` is the one message that
``info`` prints and that ``demo --platform gpu`` / ``bench --platform gpu``
fail with (``require_gpu``)."""

from __future__ import annotations

import dataclasses
import os
import sys
from importlib import metadata
from typing import List, Optional

CUDA_EXTRAS = ("cuda13", "cuda12")
# Oldest compute capability the compiled kernels run on (CMakeLists.txt: sm_80 + PTX).
MIN_COMPUTE_CAPABILITY = (8, 0)
INSTALL_GPU_JAX = ("pip install 'jax[cuda13]' (NVIDIA driver >= 580) or "
                   "'jax[cuda12]' (driver >= 525); from this repository: pip install '.[cuda13]'")


@dataclasses.dataclass
class GpuStatus:
    gpus: List[str]                 # "NVIDIA H100 80GB HBM3 (sm_90)", as JAX sees them
    jax_problem: Optional[str]      # why JAX sees no usable GPU, with the fix; None if it does
    kernels_loaded: bool            # our _jcc_cuda module imported and registered
    kernels_detail: str             # how it was built, or why it is absent, with the fix


def _cuda_plugins():
    found = []
    for extra in CUDA_EXTRAS:
        for dist in (f"jax-{extra}-plugin", f"jax-{extra}-pjrt"):
            try:
                found.append(f"{dist} {metadata.version(dist)}")
            except metadata.PackageNotFoundError:
                pass
    return found


def _driver_cuda_version():
    """The CUDA version the NVIDIA driver supports (e.g. 13000), or None."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        return v.value if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 else None
    except (OSError, AttributeError):
        return None


def _jax_gpus():
    """(descriptions, compute capabilities, error) of JAX's GPU devices."""
    import jax
    try:
        devs = jax.devices("gpu")
    except RuntimeError as e:
        return [], [], str(e).splitlines()[0]
    names, ccs = [], []
    for d in devs:
        cc = getattr(d, "compute_capability", None)
        try:
            ccs.append(tuple(int(p) for p in str(cc).split(".")[:2]))
            names.append(f"{d.device_kind} (sm_{str(cc).replace('.', '')})")
        except ValueError:
            names.append(str(d.device_kind))
    return names, ccs, None


def _kernels(build):
    from .._lowering import targets
    if targets._jcc_cuda is not None:
        how = ""
        if build is not None and build.CUDA_VERSION:
            how = f" (built with CUDA {build.CUDA_VERSION} for {build.CUDA_ARCHITECTURES}"
            if getattr(build, "CUDA_DEV_DTYPES", ""):  # (tools/device_build.sh's JCC_DEV_DTYPES)
                how += f"; a development build: the {build.CUDA_DEV_DTYPES} kernels only"
            how += ")"
        return True, "loaded" + how
    reinstall = "pip install --force-reinstall --no-deps ."
    state = getattr(build, "CUDA_BUILD", None)
    if state == "built":
        return False, (f"built but failed to load ({targets.CUDA_IMPORT_ERROR}); "
                       "check the NVIDIA driver, or reinstall")
    if state == "nvcc-not-found":
        return False, ("not built: nvcc was not found when this package was built; install "
                       "the CUDA toolkit (12.8 or newer) or set CUDACXX, then reinstall "
                       f"from the repository ({reinstall}), or install a wheel that has them")
    if state == "disabled":
        return False, ("not built: this package was built with JAX_CAUSAL_CONV_CUDA=OFF; "
                       f"reinstall with JAX_CAUSAL_CONV_CUDA=ON ({reinstall})")
    if state == "no-sources":
        return False, "not built: the source tree had no cuda/ sources"
    return False, ("not built: no _jcc_cuda module next to the package "
                   "(a development build? tools/dev_build_cpu.sh builds it with JCC_CUDA=ON)")


def _build_info():
    """What CMake recorded about this build (_build_info.py), or None."""
    try:
        from .. import _build_info as build
    except ImportError:  # a development build that did not copy it
        return None
    return build


def diagnose() -> GpuStatus:
    build = _build_info()
    loaded, detail = _kernels(build)
    names, ccs, err = _jax_gpus()
    problem = None
    if not names:
        plugins = _cuda_plugins()
        platforms = os.environ.get("JAX_PLATFORMS", "")
        if platforms and not any(p in platforms for p in ("cuda", "gpu")):
            problem = f"JAX sees no GPU: JAX_PLATFORMS={platforms} hides it (unset it)"
        elif not plugins:
            problem = f"JAX sees no GPU: this jaxlib is CPU-only; {INSTALL_GPU_JAX}"
        else:
            problem = (f"JAX sees no GPU although {', '.join(plugins)} is installed ({err}); "
                       "check nvidia-smi, the NVIDIA driver and CUDA_VISIBLE_DEVICES")
    elif loaded and ccs and min(ccs) < MIN_COMPUTE_CAPABILITY:
        problem = (f"JAX sees {', '.join(names)}, older than the kernels' minimum sm_80: "
                   "our kernels cannot run there (backend='xla' can)")
    elif loaded and build is not None and build.CUDA_VERSION:
        driver = _driver_cuda_version()
        need = int(build.CUDA_VERSION.split(".")[0]) * 1000
        if driver is not None and driver < need:
            problem = (f"the NVIDIA driver supports CUDA {driver // 1000}.{driver % 1000 // 10}, "
                       f"but these kernels were built with CUDA {build.CUDA_VERSION}: update the "
                       "driver, or build from source with a matching nvcc")
    return GpuStatus(names, problem, loaded, detail)


def gpu_problem(status: Optional[GpuStatus] = None) -> Optional[str]:
    """Why our kernels cannot run on a GPU here (the fix included), or None."""
    status = status or diagnose()
    if status.jax_problem:
        return status.jax_problem
    if not status.kernels_loaded:
        return f"JAX sees {', '.join(status.gpus)}, but our CUDA kernels are {status.kernels_detail}"
    return None


def require_gpu(prog: str) -> bool:
    """For ``--platform gpu``: print the problem to stderr (no traceback) and
    return False when our kernels cannot run on a GPU here."""
    problem = gpu_problem()
    if problem is None:
        return True
    print(f"{prog}: --platform gpu: {problem}", file=sys.stderr)
    return False
