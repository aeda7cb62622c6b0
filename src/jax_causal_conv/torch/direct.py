"""The eager shortcut past torch's dispatcher.

A custom op call goes through the dispatcher and the custom-op machinery
before the kernel launches, host time that dominates small calls (a decode
step). When nothing needs that machinery -- no tensor that autograd must
track, no tracing (torch.compile, fake or other tensor subclasses), no
functorch transform, no dispatch mode -- the op's plain implementation runs
directly; otherwise the op does. Both give the same results.
"""

from __future__ import annotations

import torch
from torch import Tensor

# (private hooks; without any of them every call takes the op)
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
_dispatch_depth = getattr(torch._C, "_len_torch_dispatch_stack", None)
_increment_version = getattr(torch.autograd.graph, "increment_version", None)
_is_compiling = getattr(torch.compiler, "is_compiling", None)
AVAILABLE = None not in (_functorch_level, _dispatch_depth, _increment_version, _is_compiling)


def allowed(tensors) -> bool:
    """Whether the plain implementation may run for these tensors (None
    entries are skipped)."""
    if not AVAILABLE or _is_compiling() or _functorch_level() is not None or _dispatch_depth():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not Tensor or (grad and t.requires_grad)):
            return False
    return True


def call(op, impl, args, mutated=None):
    """op(*args), or impl(*args) when allowed. `mutated`: the tensor the op
    writes in place; its version counter is bumped as the op's would be (so
    autograd still refuses graphs that saved its old value)."""
    if not allowed([a for a in args if isinstance(a, Tensor)]):
        return op(*args)
    out = impl(*args)
    if mutated is not None:
        _increment_version(mutated)
    return out


def bump_version(t: Tensor):
    """Record that a plain implementation wrote `t` in place."""
    _increment_version(t)
