"""``jax-causal-conv info``: versions, devices, and the FFI targets this build registers."""

from __future__ import annotations

import platform as _platform
import sys


def add_parser(sub):
    return sub.add_parser("info", help="versions, devices and registered FFI targets")


def _version(mod):
    try:
        m = __import__(mod)
    except ImportError:
        return "not installed"
    return getattr(m, "__version__", "?")


def collect() -> dict:
    import jax

    import jax_causal_conv as jcc

    devices = {}
    for plat in ("cpu", "gpu", "tpu"):
        try:
            devices[plat] = [f"{d.id}: {d.device_kind}" for d in jax.devices(plat)]
        except RuntimeError:
            pass
    return {
        "jax_causal_conv": jcc.__version__,
        "python": _platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "optax": _version("optax"),
        "default_backend": jax.default_backend(),
        "devices": devices,
        "ffi_platforms": tuple(jcc.PLATFORMS),
        "ffi_targets": tuple(jcc.TARGETS),
    }


def run(args) -> int:
    info = collect()
    w = sys.stdout.write
    w(f"jax-causal-conv {info['jax_causal_conv']}\n")
    for k in ("python", "jax", "jaxlib", "flax", "optax"):
        w(f"  {k:16s} {info[k]}\n")
    w(f"  {'default backend':16s} {info['default_backend']}\n")
    for plat, devs in info["devices"].items():
        w(f"  {plat + ' devices':16s} {', '.join(devs)}\n")
    gpus = info["devices"].get("gpu", [])
    w(f"  {'GPU':16s} {gpus[0].split(': ', 1)[1] if gpus else 'none'}\n")
    w(f"  {'FFI platforms':16s} {', '.join(info['ffi_platforms']) or 'none (pure-XLA fallback)'}\n")
    w(f"  {'FFI targets':16s} {', '.join(info['ffi_targets'])}\n")
    return 0
