"""``jax-causal-conv info``: versions, devices, whether our kernels can run on a
GPU here (and the fix when not), and the FFI targets this build registers."""

from __future__ import annotations

import platform as _platform
import sys


def add_parser(sub):
    return sub.add_parser("info", help="versions, devices, GPU readiness and registered FFI "
                                       "targets")


def _version(dist):
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def collect() -> dict:
    import jax

    import jax_causal_conv as jcc

    from .gpu_status import diagnose, gpu_problem

    devices = {}
    for plat in ("cpu", "gpu", "tpu"):
        try:
            devices[plat] = [f"{d.id}: {d.device_kind}" for d in jax.devices(plat)]
        except RuntimeError:
            pass
    gpu = diagnose()
    return {
        "jax_causal_conv": jcc.__version__,
        "python": _platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "optax": _version("optax"),
        "default_backend": jax.default_backend(),
        "devices": devices,
        "gpu": gpu,
        "gpu_problem": gpu_problem(gpu),
        "ffi_platforms": tuple(jcc.PLATFORMS),
        "ffi_targets": tuple(jcc.TARGETS),
    }


def run(args) -> int:
    info = collect()
    gpu = info["gpu"]

    def line(key, value):
        sys.stdout.write(f"  {key:16s} {value}\n")

    sys.stdout.write(f"jax-causal-conv {info['jax_causal_conv']}\n")
    for k in ("python", "jax", "jaxlib", "flax", "optax"):
        line(k, info[k])
    line("default backend", info["default_backend"])
    for plat, devs in info["devices"].items():
        line(plat + " devices", ", ".join(devs))
    line("GPU (JAX)", ", ".join(gpu.gpus) if gpu.gpus else gpu.jax_problem)
    line("CUDA kernels", gpu.kernels_detail)
    where = ["cpu"] + (["gpu"] if info["gpu_problem"] is None else [])
    line("our kernels run", "on " + " and ".join(where))
    if info["gpu_problem"] is not None and gpu.gpus:
        line("GPU problem", info["gpu_problem"])
    line("FFI targets", ", ".join(info["ffi_targets"]))
    return 0
