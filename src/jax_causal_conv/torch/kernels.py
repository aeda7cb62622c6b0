"""The compiled modules behind the adapter: which one serves a tensor's
device, what its DLPack entry points accept, and how a call reaches them.

Tensors are handed over as DLPack capsules (``to_dlpack``, a fraction of
the cost of the ``__dlpack__`` protocol nanobind would otherwise call, and
indifferent to ``requires_grad``); CUDA kernels run on torch's current
stream of the tensors' device, passed as a raw handle.
"""

from __future__ import annotations

import torch
from torch.utils.dlpack import to_dlpack

from .. import _jcc_cpu

try:  # absent in CPU-only builds
    from .. import _jcc_cuda  # type: ignore[attr-defined]
except ImportError as e:  # pragma: no cover - depends on the build
    _jcc_cuda = None
    _CUDA_IMPORT_ERROR = str(e)
else:
    _CUDA_IMPORT_ERROR = None


def _takes(fn, arg: str) -> bool:
    """Whether a nanobind function has a parameter named `arg` (its
    signature is the first line of its docstring)."""
    sig = (getattr(fn, "__doc__", None) or "").split("\n", 1)[0]
    return f"{arg}:" in sig or f"{arg}=" in sig


class Kernels:
    """One compiled module as the adapter uses it.

    strided_x: x may be a strided view whose innermost axis in its layout
        is unit-stride (the module says so with ``strided_x = True``);
        otherwise x is made dense first.
    channels_last_decode: ``update`` and ``varlen_states`` take a
        ``channels_last`` flag (states (N, state_len, D)).
    """

    def __init__(self, mod, cuda: bool):
        self.mod = mod
        self.cuda = cuda
        self.strided_x = bool(getattr(mod, "strided_x", False))
        self.channels_last_decode = (_takes(mod.update, "channels_last")
                                     and _takes(mod.varlen_states, "channels_last"))


CPU = Kernels(_jcc_cpu, cuda=False)
CUDA = (Kernels(_jcc_cuda, cuda=True)
        if _jcc_cuda is not None and hasattr(_jcc_cuda, "fwd") else None)

# Raw handles, without building torch.cuda.Stream objects (private hooks,
# with the public spelling as the fallback).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
    (lambda index: torch.cuda.current_stream(index).cuda_stream)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or \
    (lambda: torch.cuda.current_device())


def for_device(device: torch.device) -> Kernels:
    kind = device.type
    if kind == "cpu":
        return CPU
    if kind == "cuda":
        if CUDA is None:
            why = _CUDA_IMPORT_ERROR or "the CUDA module has no DLPack entry points"
            raise RuntimeError("jax_causal_conv.torch: CUDA tensors need the CUDA kernels "
                               f"(build with nvcc available): {why}")
        return CUDA
    raise ValueError(f"jax_causal_conv.torch: tensors on device {device} are not supported "
                     "(cpu or cuda)")


def cap(t):
    """A tensor as a DLPack capsule; None stays None."""
    return None if t is None else to_dlpack(t)


def launch(k: Kernels, device: torch.device, fn, *args, **kwargs):
    """fn(*args, **kwargs), an entry point of k.mod (tensors already
    capsules); on CUDA on the current stream of `device`, made the current
    device for the call if it is not."""
    if not k.cuda:
        return fn(*args, **kwargs)
    index = device.index
    if index is None or index == _current_device():
        return fn(*args, **kwargs, stream=_raw_stream(_current_device() if index is None else index))
    with torch.cuda.device(index):
        return fn(*args, **kwargs, stream=_raw_stream(index))
