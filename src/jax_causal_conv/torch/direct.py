"""The eager shortcuts past torch's dispatcher.

A custom op call goes through the dispatcher and the custom-op machinery
(and, under autograd, its autograd wrapper) before the kernel launches:
host time that dominates small calls such as a decode step. Eager calls
that need none of it skip it:

- PLAIN: no tensor that autograd must track, and nothing that intercepts
  ops (tracing, fake or other tensor subclasses, functorch transforms,
  dispatch modes): the plain implementation runs directly.
- AUTOGRAD: the same, except that autograd must track the call: the plain
  implementations run inside ``EagerConv``, a ``torch.autograd.Function``
  with the custom op's formulas (impl.conv_backward).
- OP: anything else goes through the custom op.

All three give the same results.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import impl

OP, PLAIN, AUTOGRAD = 0, 1, 2

# (private hooks; without any of them every call takes the op)
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
_dispatch_depth = getattr(torch._C, "_len_torch_dispatch_stack", None)
_increment_version = getattr(torch.autograd.graph, "increment_version", None)
_is_compiling = getattr(torch.compiler, "is_compiling", None)
AVAILABLE = None not in (_functorch_level, _dispatch_depth, _increment_version, _is_compiling)


def path(tensors) -> int:
    """How a call on these tensors (None entries skipped) runs."""
    if not AVAILABLE or _is_compiling() or _functorch_level() is not None or _dispatch_depth():
        return OP
    grad = torch.is_grad_enabled()
    tracked = False
    for t in tensors:
        if t is not None:
            if type(t) is not Tensor:
                return OP
            tracked = tracked or (grad and t.requires_grad)
    return AUTOGRAD if tracked else PLAIN


def bump_version(t: Tensor):
    """Record that a plain implementation wrote `t` in place (as the op's
    mutation would), so autograd still refuses graphs that saved its old value."""
    _increment_version(t)


def _run_backward(*args):
    if path(args[:7]) == PLAIN:
        return impl.backward(*args)
    return torch.ops.jax_causal_conv.causal_conv1d_bwd(*args)  # e.g. under a dispatch mode


class EagerConv(torch.autograd.Function):
    """The forward op's autograd, eagerly: apply(*the op's arguments) ->
    (y, final_states or None)."""

    @staticmethod
    def forward(ctx, x, weight, bias, seq_idx, initial_states, return_final_states, activation,
                channels_last, states_channels_last):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, weight, bias, seq_idx, initial_states)
        ctx.flags = (return_final_states, activation, channels_last, states_channels_last)
        return impl.forward(x, weight, bias, seq_idx, initial_states, return_final_states,
                            activation, channels_last, states_channels_last)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy, dfs):
        dx, dw, db, di = impl.conv_backward(_run_backward, ctx.saved_tensors, ctx.flags, dy, dfs)
        return dx, dw, db, None, di, None, None, None, None
