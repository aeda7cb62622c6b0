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
    compact_args: the entry points also take weight as (D, W), bias as
        (D,), and update's x and y as (B, D) for one token (the module says
        so with ``compact_args = True``); otherwise they get the rank-3/2/3
        views, each a view op on the host.
    """

    def __init__(self, mod, cuda: bool):
        self.mod = mod
        self.cuda = cuda
        self.strided_x = bool(getattr(mod, "strided_x", False))
        self.compact_args = bool(getattr(mod, "compact_args", False))
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


def for_tensor(t: torch.Tensor) -> Kernels:
    """The kernels for t's device (is_cpu/is_cuda: cheaper than t.device)."""
    if t.is_cpu:
        return CPU
    if t.is_cuda and CUDA is not None:
        return CUDA
    return for_device(t.device)


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


def weight_cap(k: Kernels, weight):
    """weight (D, W) as the entry points take it: (groups=1, D, W) unless compact."""
    return to_dlpack(weight if k.compact_args else weight.unsqueeze(0))


def bias_cap(k: Kernels, bias):
    """bias (D,) as the entry points take it: (groups=1, D) unless compact."""
    if bias is None:
        return None
    return to_dlpack(bias if k.compact_args else bias.unsqueeze(0))


def launch(k: Kernels, like: torch.Tensor, fn, *args, **kwargs):
    """fn(*args, **kwargs), an entry point of k.mod (tensors already
    capsules); on CUDA on the current stream of the device of `like`, made
    the current device for the call if it is not."""
    if not k.cuda:
        return fn(*args, **kwargs)
    index = like.get_device()
    if index == _current_device():
        return fn(*args, **kwargs, stream=_raw_stream(index))
    with torch.cuda.device(index):
        return fn(*args, **kwargs, stream=_raw_stream(index))
