"""PyTorch adapter: a drop-in for Dao-AILab ``causal_conv1d``'s public API on
this package's kernels.

    from jax_causal_conv.torch import causal_conv1d_fn, causal_conv1d_update
    y = causal_conv1d_fn(x, weight, bias, activation="silu")   # x (B, D, L)

- ``causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
  return_final_states=False, final_states_out=None, activation=None)``
- ``causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
  cache_seqlens=None, conv_state_indices=None)``: updates ``conv_state`` in place
- ``causal_conv1d_varlen_states(x, cu_seqlens, state_len)``
- ``causal_conv1d_ref``, ``causal_conv1d_update_ref``,
  ``causal_conv1d_varlen_states_ref``: plain-torch references (SPEC.md's math)

Tensors reach the C++/CUDA kernels through DLPack (no copy); CUDA tensors run
on ``torch.cuda.current_stream()``. The ops are ``torch.library`` custom ops
(namespace ``jax_causal_conv``) with fake implementations and autograd
formulas, so ``torch.compile(fullgraph=True)`` traces them without graph
breaks and ``torch.autograd`` differentiates ``causal_conv1d_fn`` with respect
to x, weight, bias and initial_states (accepting a gradient for the final
states). Calls that need none of that (no tensor requiring grad, no tracing,
no functorch transform or dispatch mode) run the op's implementation
directly, skipping the dispatcher's host overhead.

Layouts follow Dao's library: ``x`` (batch, dim, seqlen) is channel-last when
``x.stride(1) == 1`` and ``x.stride(2) != 1`` (a transposed view of a
(batch, seqlen, dim) tensor), else channel-first; the output has x's layout.
States (batch, dim, width-1) are likewise channel-last when ``stride(1) == 1``.
Returned final states take the layout of ``initial_states``, else of
``final_states_out``, else of ``x`` (channel-last x gives Dao's
``empty(batch, width-1, dim).transpose(1, 2)``). Inputs that are not dense in
their layout are copied first. Beyond Dao: final states are supported for
channel-first x too, weight/bias may have a dtype other than x's, and float64
works on CPU. ``causal_conv1d_varlen_states`` returns a contiguous
(batch, dim, state_len) tensor (Dao's is a transposed channel-last view; the
values are the same).

``import jax_causal_conv`` never needs torch; this module does.
"""

from typing import Optional

try:
    import torch
    from torch import Tensor
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("jax_causal_conv.torch needs PyTorch: pip install 'jax-causal-conv[torch]'") from e

import torch.nn.functional as F
from torch.utils.dlpack import to_dlpack

from . import _jcc_cpu

try:  # absent in CPU-only builds
    from . import _jcc_cuda  # type: ignore[attr-defined]
except ImportError as e:  # pragma: no cover - depends on the build
    _jcc_cuda = None
    _CUDA_IMPORT_ERROR = str(e)
else:
    _CUDA_IMPORT_ERROR = None

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "causal_conv1d_varlen_states",
    "causal_conv1d_ref",
    "causal_conv1d_update_ref",
    "causal_conv1d_varlen_states_ref",
]

MAX_WIDTH = int(_jcc_cpu.max_width)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_GPU_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class ActivationError(ValueError, NotImplementedError):
    """Unknown activation: a ValueError (this package's convention) that is
    also the NotImplementedError Dao's library raises."""


def _activation(activation) -> int:
    if activation is None or activation is False:
        return 0
    if activation is True or activation in ("silu", "swish"):
        return 1
    raise ActivationError(f"activation must be None, 'silu' or 'swish', got {activation!r}")


# --- layouts ---------------------------------------------------------------------


def _is_channel_last(t: Tensor) -> bool:
    """Dao's test for a (batch, dim, len) tensor stored as (batch, len, dim)."""
    return t.stride(1) == 1 and t.stride(2) != 1


def _dense(t: Tensor, channel_last: bool) -> Tensor:
    """t (batch, dim, len), densely stored as (batch, len, dim) if channel_last
    else (batch, dim, len): a copy only when it is not already."""
    if channel_last:
        tt = t.transpose(1, 2)
        return t if tt.is_contiguous() else tt.contiguous().transpose(1, 2)
    return t.contiguous()


def _empty3(b, d, n, channel_last, like: Tensor, dtype=None) -> Tensor:
    """Fresh (b, d, n) tensor in the given layout: strides depend only on the
    flags, so the fake and real implementations agree exactly."""
    dtype = dtype or like.dtype
    if channel_last:
        return torch.empty((b, n, d), dtype=dtype, device=like.device).transpose(1, 2)
    return torch.empty((b, d, n), dtype=dtype, device=like.device)


def _kernel_view(t: Optional[Tensor], channel_last: bool) -> Optional[Tensor]:
    """The array the kernels see: (b, n, d) for channel-last, else (b, d, n)."""
    if t is None:
        return None
    return t.transpose(1, 2) if channel_last else t


class _Backend:
    """The compiled module and stream for a tensor's device; on CUDA also
    makes that device current for the call."""

    def __init__(self, t: Tensor):
        self.cuda = t.device.type == "cuda"
        if t.device.type == "cpu":
            self.mod = _jcc_cpu
        elif self.cuda:
            if _jcc_cuda is None or not hasattr(_jcc_cuda, "fwd"):
                why = _CUDA_IMPORT_ERROR or "the CUDA module has no DLPack entry points"
                raise RuntimeError("jax_causal_conv.torch: CUDA tensors need the CUDA kernels "
                                   f"(build with nvcc available): {why}")
            self.mod = _jcc_cuda
            self._guard = torch.cuda.device(t.device)
        else:
            raise ValueError(f"jax_causal_conv.torch: tensors on device {t.device} are not "
                             "supported (cpu or cuda)")
        self.device = t.device

    def __enter__(self):
        if self.cuda:
            self._guard.__enter__()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            return self._guard.__exit__(*exc)
        return False

    def run(self, fn, *args, with_stream=True, **kwargs):
        """The module's fn on (args, kwargs), tensors passed as DLPack
        capsules: `to_dlpack` costs ~0.4 us a tensor where `__dlpack__`
        (what nanobind calls on a tensor) costs ~3 us, and the kernels run on
        torch's current stream (passed on CUDA unless with_stream is False),
        so no stream handshake is needed."""
        def conv(a):  # (DLPack refuses tensors that require grad)
            return to_dlpack(a.detach()) if isinstance(a, Tensor) else a
        kwargs = {k: conv(v) for k, v in kwargs.items()}
        if self.cuda and with_stream:
            kwargs["stream"] = torch.cuda.current_stream(self.device).cuda_stream
        return getattr(self.mod, fn)(*map(conv, args), **kwargs)


# --- custom ops ------------------------------------------------------------------
# The public functions call the ops through _call, which skips torch's
# dispatcher when nothing needs it: its custom-op machinery costs ~70 us of
# host time per call (measured on a 2-core CPU host; a (8,4096,4096) bf16
# forward kernel takes ~180 us), paid before the kernel launches.


# (private torch hooks: without any of them, every call takes the op)
_functorch_level = getattr(getattr(torch._C, "_functorch", None), "maybe_current_level", None)
_dispatch_depth = getattr(torch._C, "_len_torch_dispatch_stack", None)
_CAN_SKIP = (_functorch_level is not None and _dispatch_depth is not None
             and hasattr(torch.compiler, "is_compiling")
             and hasattr(torch.autograd.graph, "increment_version"))


def _call(op, *args, mutated=None):
    """op(*args), or op's implementation directly when no tensor needs
    autograd, nothing traces (torch.compile, fake or wrapped tensors,
    functorch transforms, dispatch modes). `mutated`: the tensor the op
    writes in place, whose version counter is then bumped as the op's
    would be."""
    impl = getattr(op, "_init_fn", None)
    tensors = [a for a in args if isinstance(a, Tensor)]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if (not _CAN_SKIP or impl is None or grad or torch.compiler.is_compiling()
            or any(type(t) is not Tensor for t in tensors)
            or _functorch_level() is not None or _dispatch_depth() > 0):
        return op(*args)
    out = impl(*args)
    if mutated is not None:
        torch.autograd.graph.increment_version(mutated)
    return out


# Their tensors already have the layouts the flags name (the public wrappers
# make sure of it); the impls re-densify defensively, which costs nothing when
# the layout is right.


@torch.library.custom_op("jax_causal_conv::causal_conv1d_fwd", mutates_args=())
def _fwd_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
            initial_states: Optional[Tensor], return_final_states: bool, activation: int,
            channels_last: bool, states_channels_last: bool) -> tuple[Tensor, Tensor]:
    B, D, L = x.shape
    W = weight.shape[1]
    x = _dense(x, channels_last)
    y = _empty3(B, D, L, channels_last, x)
    fs = (_empty3(B, D, W - 1, states_channels_last, x) if return_final_states
          else x.new_empty((0,)))
    init = None if initial_states is None else _dense(initial_states, states_channels_last)
    with _Backend(x) as be:
        be.run("fwd", _kernel_view(x, channels_last), weight.contiguous().unsqueeze(0),
               None if bias is None else bias.contiguous().unsqueeze(0), None,
               seq_idx, None, _kernel_view(init, states_channels_last),
               _kernel_view(y, channels_last),
               _kernel_view(fs, states_channels_last) if return_final_states else None,
               activation, 1 if seq_idx is not None else 0, channels_last,
               states_channels_last)
    return y, fs


@_fwd_op.register_fake
def _fwd_fake(x, weight, bias, seq_idx, initial_states, return_final_states, activation,
              channels_last, states_channels_last):
    B, D, L = x.shape
    W = weight.shape[1]
    y = _empty3(B, D, L, channels_last, x)
    fs = (_empty3(B, D, W - 1, states_channels_last, x) if return_final_states
          else x.new_empty((0,)))
    return y, fs


def _bwd_outputs(x, weight, bias, has_init, channels_last, states_channels_last):
    """The backward's empty results (dx, dweight, dbias, dinitial_states), shared
    by the real op and its fake so their layouts always agree."""
    B, D, L = x.shape
    W = weight.shape[1]
    dx = _empty3(B, D, L, channels_last, x)
    dw = torch.empty((D, W), dtype=weight.dtype, device=x.device)
    db = (torch.empty((D,), dtype=bias.dtype, device=x.device) if bias is not None
          else x.new_empty((0,)))
    di = _empty3(B, D, W - 1, states_channels_last, x) if has_init else x.new_empty((0,))
    return dx, dw, db, di


@torch.library.custom_op("jax_causal_conv::causal_conv1d_bwd", mutates_args=())
def _bwd_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
            initial_states: Optional[Tensor], dy: Tensor, dfinal_states: Optional[Tensor],
            activation: int, channels_last: bool,
            states_channels_last: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    x = _dense(x, channels_last)
    dy = _dense(dy, channels_last)
    init = None if initial_states is None else _dense(initial_states, states_channels_last)
    dfs = None if dfinal_states is None else _dense(dfinal_states, states_channels_last)
    dx, dw, db, di = _bwd_outputs(x, weight, bias, init is not None, channels_last,
                                  states_channels_last)
    w3 = weight.contiguous().unsqueeze(0)
    b2 = None if bias is None else bias.contiguous().unsqueeze(0)
    xk, ik = _kernel_view(x, channels_last), _kernel_view(init, states_channels_last)
    mode = 1 if seq_idx is not None else 0
    with _Backend(x) as be:
        extra = {}
        if be.cuda:
            nbytes = be.run("bwd_workspace_bytes", xk, w3, b2, seq_idx, None, ik, activation, mode,
                            channels_last, states_channels_last, with_stream=False)
            extra["workspace"] = torch.empty((max(int(nbytes), 1),), dtype=torch.uint8,
                                             device=x.device)
        be.run("bwd", xk, w3, b2, seq_idx, None, ik, _kernel_view(dy, channels_last),
               _kernel_view(dfs, states_channels_last), _kernel_view(dx, channels_last),
               dw.unsqueeze(0), None if bias is None else db.unsqueeze(0),
               _kernel_view(di, states_channels_last) if init is not None else None,
               activation, mode, channels_last, states_channels_last, **extra)
    return dx, dw, db, di


@_bwd_op.register_fake
def _bwd_fake(x, weight, bias, seq_idx, initial_states, dy, dfinal_states, activation,
              channels_last, states_channels_last):
    return _bwd_outputs(x, weight, bias, initial_states is not None, channels_last,
                        states_channels_last)


def _fwd_setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, init, rfs, act, cl, scl = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx, init)
    ctx.flags = (rfs, act, cl, scl)


def _fwd_backward(ctx, dy, dfs):
    x, weight, bias, seq_idx, init = ctx.saved_tensors
    rfs, act, cl, scl = ctx.flags
    if dy is None:
        dy = torch.zeros_like(x)
    dy = _dense(dy, cl)
    if not rfs or dfs is None:
        dfs = None
    else:
        dfs = _dense(dfs, scl)
    dx, dw, db, di = _bwd_op(x, weight, bias, seq_idx, init, dy, dfs, act, cl, scl)
    return (dx, dw, db if bias is not None else None, None,
            di if init is not None else None, None, None, None, None)


_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


@torch.library.custom_op("jax_causal_conv::causal_conv1d_update", mutates_args=("conv_state",))
def _update_op(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor],
               activation: int, cache_seqlens: Optional[Tensor],
               conv_state_indices: Optional[Tensor]) -> Tensor:
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    with _Backend(x) as be:
        be.run("update", x, conv_state, weight.contiguous().unsqueeze(0),
               None if bias is None else bias.contiguous().unsqueeze(0),
               cache_seqlens, conv_state_indices, y, activation)
    return y


@_update_op.register_fake
def _update_fake(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("jax_causal_conv::causal_conv1d_varlen_states", mutates_args=())
def _varlen_states_op(x: Tensor, cu_seqlens: Tensor, state_len: int) -> Tensor:
    x = x.contiguous()
    states = torch.empty((cu_seqlens.shape[0] - 1, x.shape[1], state_len), dtype=x.dtype,
                         device=x.device)
    with _Backend(x) as be:
        be.run("varlen_states", x, cu_seqlens, states)
    return states


@_varlen_states_op.register_fake
def _varlen_states_fake(x, cu_seqlens, state_len):
    return torch.empty((cu_seqlens.shape[0] - 1, x.shape[1], state_len), dtype=x.dtype,
                       device=x.device)


# --- argument checks ----------------------------------------------------------------


def _shape_str(shape) -> str:
    shape = tuple(shape)
    return "(" + ", ".join(str(int(s)) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _check_tensor(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_float(name, t: Tensor):
    _check_tensor(name, t)
    if t.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, got {t.dtype}")
    if t.device.type == "cuda" and t.dtype not in _GPU_FLOATS:
        raise TypeError(f"{name}: float64 is CPU-only; use float32, float16 or bfloat16 on "
                        f"CUDA, got {t.dtype}")


def _check_int32(name, t: Tensor):
    _check_tensor(name, t)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")


def _check_shape(name, t: Tensor, expected, what=""):
    if tuple(t.shape) != tuple(expected):
        extra = f" {what}" if what else ""
        raise ValueError(f"{name} must have shape {_shape_str(expected)}{extra}, "
                         f"got {_shape_str(t.shape)}")


def _check_device(name, t: Tensor, x: Tensor):
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _check_weights(weight, bias, x, dim):
    _check_float("weight", weight)
    _check_device("weight", weight, x)
    if weight.dim() != 2 or weight.shape[0] != dim:
        raise ValueError(f"weight must have shape (dim, width) = ({dim}, width), "
                         f"got {_shape_str(weight.shape)}")
    width = weight.shape[1]
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"weight width must be in [1, {MAX_WIDTH}], got {width}")
    if bias is not None:
        _check_float("bias", bias)
        _check_device("bias", bias, x)
        _check_shape("bias", bias, (dim,), "(dim,)")
    return width


def _check_states(name, t: Tensor, x: Tensor, batch, dim, width):
    _check_tensor(name, t)
    _check_device(name, t, x)
    if t.dtype != x.dtype:
        raise TypeError(f"{name} must have the dtype of x ({x.dtype}), got {t.dtype}")
    _check_shape(name, t, (batch, dim, width - 1), "(batch, dim, width - 1)")


# --- public API -----------------------------------------------------------------------


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None):
    """Causal depthwise conv1d (Dao's ``causal_conv1d_fn``).

    x: (batch, dim, seqlen); weight: (dim, width); bias: (dim,);
    seq_idx: (batch, seqlen) int32; initial_states: (batch, dim, width - 1);
    final_states_out: (batch, dim, width - 1), written to when given;
    activation: None, "silu" or "swish".

    Returns out (batch, dim, seqlen), or (out, final_states) when
    return_final_states.
    """
    act = _activation(activation)
    _check_float("x", x)
    if x.dim() != 3:
        raise ValueError(f"x must have rank 3 (batch, dim, seqlen), got shape {_shape_str(x.shape)}")
    B, D, L = x.shape
    W = _check_weights(weight, bias, x, D)
    if seq_idx is not None:
        _check_int32("seq_idx", seq_idx)
        _check_device("seq_idx", seq_idx, x)
        _check_shape("seq_idx", seq_idx, (B, L), "(batch, seqlen)")
        if initial_states is not None:
            raise ValueError("initial_states must be None if seq_idx is given")
        if return_final_states:
            raise ValueError("return_final_states is not supported with seq_idx")
        seq_idx = seq_idx.contiguous()
    if initial_states is not None:
        _check_states("initial_states", initial_states, x, B, D, W)
    if not return_final_states:
        final_states_out = None
    if final_states_out is not None:
        _check_states("final_states_out", final_states_out, x, B, D, W)

    cl = _is_channel_last(x)
    x = _dense(x, cl)
    if initial_states is not None:
        scl = _is_channel_last(initial_states)
    elif final_states_out is not None:
        scl = _is_channel_last(final_states_out)
    else:
        scl = cl
    if initial_states is not None:
        initial_states = _dense(initial_states, scl)
    weight = weight.contiguous()
    bias = bias.contiguous() if bias is not None else None

    y, fs = _call(_fwd_op, x, weight, bias, seq_idx, initial_states, bool(return_final_states), act,
                  cl, scl)
    if not return_final_states:
        return y
    if final_states_out is not None:
        final_states_out.copy_(fs)
        fs = final_states_out
    return y, fs


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """Decode step (Dao's ``causal_conv1d_update``), updating ``conv_state`` in place.

    x: (batch, dim) or (batch, dim, seqlen); conv_state: (batch, dim, state_len)
    with state_len >= width - 1, or (num_slots, dim, state_len) with
    conv_state_indices; weight: (dim, width); bias: (dim,);
    cache_seqlens: (batch,) int32, the state is then a circular buffer;
    conv_state_indices: (batch,) int32 state slot per row, -1 for padding rows
    (zero output, no state change).

    Returns out, shaped like x. Not differentiable.
    """
    act = _activation(activation)
    _check_float("x", x)
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    if x.dim() != 3:
        raise ValueError("x must have shape (batch, dim) or (batch, dim, seqlen), "
                         f"got {_shape_str(x.shape)}")
    B, D, S = x.shape
    W = _check_weights(weight, bias, x, D)
    _check_tensor("conv_state", conv_state)
    _check_device("conv_state", conv_state, x)
    if conv_state.dtype != x.dtype:
        raise TypeError(f"conv_state must have the dtype of x ({x.dtype}), got {conv_state.dtype}")
    if conv_state.dim() != 3 or conv_state.shape[1] != D:
        raise ValueError(f"conv_state must have shape (batch, {D}, state_len), "
                         f"got {_shape_str(conv_state.shape)}")
    state_len = conv_state.shape[2]
    if state_len < W - 1:
        raise ValueError(f"conv_state's state_len {state_len} must be >= width - 1 = {W - 1}")
    if cache_seqlens is not None:
        _check_int32("cache_seqlens", cache_seqlens)
        _check_device("cache_seqlens", cache_seqlens, x)
        _check_shape("cache_seqlens", cache_seqlens, (B,), "(batch,)")
        cache_seqlens = cache_seqlens.contiguous()
    if conv_state_indices is not None:
        _check_int32("conv_state_indices", conv_state_indices)
        _check_device("conv_state_indices", conv_state_indices, x)
        _check_shape("conv_state_indices", conv_state_indices, (B,), "(batch,)")
        conv_state_indices = conv_state_indices.contiguous()
    elif conv_state.shape[0] < B:
        raise ValueError(f"conv_state has {conv_state.shape[0]} rows for batch {B}: "
                         "pass conv_state_indices to map rows to slots")
    x = x.contiguous()
    weight = weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    if conv_state.is_contiguous():
        y = _call(_update_op, x, conv_state, weight, bias, act, cache_seqlens, conv_state_indices,
                  mutated=conv_state)
    else:  # the kernels need a dense state: work on a copy, write it back
        state = conv_state.contiguous()
        y = _call(_update_op, x, state, weight, bias, act, cache_seqlens, conv_state_indices,
                  mutated=state)
        conv_state.copy_(state)
    return y.squeeze(-1) if squeeze else y


def causal_conv1d_varlen_states(x, cu_seqlens, state_len):
    """The last ``state_len`` inputs of each packed sequence, zero-padded on
    the left (Dao's ``causal_conv1d_varlen_states``).

    x: (total_tokens, dim); cu_seqlens: (batch + 1,) integer offsets from 0 to
    total_tokens, non-decreasing. Returns (batch, dim, state_len). Forward only.
    """
    _check_float("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must have rank 2 (total_tokens, dim), got shape {_shape_str(x.shape)}")
    _check_tensor("cu_seqlens", cu_seqlens)
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or \
            cu_seqlens.dtype == torch.bool:
        raise TypeError(f"cu_seqlens must be an integer tensor (int32), got {cu_seqlens.dtype}")
    _check_device("cu_seqlens", cu_seqlens, x)
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must have shape (batch + 1,), got {_shape_str(cu_seqlens.shape)}")
    state_len = int(state_len)
    if state_len < 0:
        raise ValueError(f"state_len must be >= 0, got {state_len}")
    return _call(_varlen_states_op, x, cu_seqlens.to(torch.int32).contiguous(), state_len)


# --- plain-torch references ----------------------------------------------------------


def _acc_dtype(*ts):
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) \
        else torch.float32


def causal_conv1d_ref(x, weight, bias=None, initial_states=None, return_final_states=False,
                      final_states_out=None, activation=None, seq_idx=None):
    """SPEC.md's math in plain torch (float32 accumulation, float64 if any
    input is float64): y[b,d,t] = act(bias[d] + sum_k weight[d,k] * xp[b,d,t+k])
    with xp = concat(initial_states or zeros, x). ``seq_idx`` (an extension of
    Dao's reference) masks taps that cross a sequence boundary."""
    act = _activation(activation)
    B, D, L = x.shape
    W = weight.shape[1]
    H = W - 1
    acc = _acc_dtype(x, weight, bias, initial_states)
    hist = (initial_states.to(acc) if initial_states is not None
            else x.new_zeros((B, D, H), dtype=acc))
    xp = torch.cat([hist, x.to(acc)], dim=-1)  # (B, D, H + L)
    w = weight.to(acc)
    y = torch.zeros((B, D, L), dtype=acc, device=x.device)
    if bias is not None:
        y = y + bias.to(acc)[None, :, None]
    t = torch.arange(L, device=x.device)
    for k in range(W):
        term = w[None, :, k, None] * xp[:, :, k:k + L]
        if seq_idx is not None:
            src = t + k - H  # the input time this tap reads
            ok = src >= 0
            same = seq_idx[:, src.clamp(min=0)] == seq_idx[:, t]
            term = term * (same & ok[None, :])[:, None, :].to(acc)
        y = y + term
    if act:
        y = F.silu(y)
    y = y.to(x.dtype)
    if not return_final_states:
        return y
    fs = xp[:, :, xp.shape[-1] - H:].to(x.dtype)
    if final_states_out is not None:
        final_states_out.copy_(fs)
        fs = final_states_out
    return y, fs


def causal_conv1d_update_ref(x, conv_state, weight, bias=None, activation=None,
                             cache_seqlens=None, conv_state_indices=None):
    """The decode step in plain torch, updating ``conv_state`` in place; the
    same as ``causal_conv1d_ref`` on the state's history followed by x."""
    act = _activation(activation)
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    B, D, S = x.shape
    W = weight.shape[1]
    H = W - 1
    SL = conv_state.shape[-1]
    acc = _acc_dtype(x, weight, bias)
    ys = []
    for b in range(B):
        slot = int(conv_state_indices[b]) if conv_state_indices is not None else b
        if slot < 0:
            ys.append(torch.zeros((D, S), dtype=x.dtype, device=x.device))
            continue
        st = conv_state[slot]
        if cache_seqlens is None:
            hist = st[:, SL - H:]
            new = torch.cat([st, x[b]], dim=-1)[:, -SL:] if SL > 0 else st
        else:
            c = int(cache_seqlens[b])
            hist = st[:, [(c - H + j) % SL for j in range(H)]]
            new = st.clone()
            for s in range(S):
                new[:, (c + s) % SL] = x[b, :, s]
        xp = torch.cat([hist, x[b]], dim=-1).to(acc)
        y = torch.zeros((D, S), dtype=acc, device=x.device)
        if bias is not None:
            y = y + bias.to(acc)[:, None]
        for k in range(W):
            y = y + weight.to(acc)[:, k, None] * xp[:, k:k + S]
        if act:
            y = F.silu(y)
        ys.append(y.to(x.dtype))
        conv_state[slot].copy_(new)
    y = torch.stack(ys) if ys else x.new_empty((0, D, S))
    return y.squeeze(-1) if squeeze else y


def causal_conv1d_varlen_states_ref(x, cu_seqlens, state_len):
    """The last ``state_len`` inputs of each packed sequence, zero-padded on the left."""
    N = cu_seqlens.shape[0] - 1
    out = x.new_zeros((N, x.shape[1], state_len))
    for n in range(N):
        lo, hi = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        take = min(state_len, hi - lo)
        if take > 0:
            out[n, :, state_len - take:] = x[hi - take:hi].T
    return out
