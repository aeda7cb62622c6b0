"""The public functions, with Dao-AILab ``causal_conv1d`` 1.7's signatures
and semantics (see the package docstring): argument checks, layouts, and
the choice between the custom op and the direct path."""

from __future__ import annotations

from torch import Tensor

from .. import validation as V
from . import direct, impl, ops
from .kernels import for_tensor
from .layout import for_kernel, is_channel_last, is_dense, tokens_for_kernel

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_varlen_states"]


def _layout_fix(to_channels_last: bool) -> str:
    if to_channels_last:
        return ("jax_causal_conv.torch takes x as (batch, dim, seqlen) like Dao's causal_conv1d; "
                "pass (batch, seqlen, dim) data as x.transpose(1, 2), a channel-last view (no copy)")
    return "pass x as (batch, dim, seqlen)"


# The adapter hands tensors to the kernels as they are: exact dtypes; index
# values on the device are not read back (the CPU entry points check them).
TORCH = V.Conventions(exact_dtypes=True, host_values=lambda a: None, layout_fix=_layout_fix)


def _tensors(x, named):
    """x and every non-None tensor of `named` ((name, value) pairs) are
    torch tensors on x's device."""
    if not isinstance(x, Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    dev = x.device
    for name, t in named:
        if t is not None:
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if t.device != dev:
                raise ValueError(f"{name} is on {t.device} but x is on {dev}")


def _contiguous(t):
    return None if t is None else t.contiguous()


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
                     return_final_states=False, final_states_out=None, activation=None):
    """Causal depthwise conv1d (Dao's ``causal_conv1d_fn``).

    x: (batch, dim, seqlen), channel-last when a transposed (batch, seqlen,
    dim) view; weight: (dim, width); bias: (dim,); seq_idx: (batch, seqlen)
    int32 sequence ids (equal ids see each other, ids < 0 are padding with
    zero output); initial_states: (batch, dim, width - 1), the history of
    each row's first segment; final_states_out: (batch, dim, width - 1),
    written to when given; activation: None, "silu"/"swish" or True.

    Returns out (batch, dim, seqlen) in x's layout, or (out, final_states)
    when return_final_states.
    """
    if not return_final_states:
        final_states_out = None
    _tensors(x, (("weight", weight), ("bias", bias), ("seq_idx", seq_idx),
                 ("initial_states", initial_states), ("final_states_out", final_states_out)))
    act = V.check_conv(x, weight, bias, None, seq_idx, initial_states, False, activation, TORCH)
    B, D, L = x.shape
    if final_states_out is not None:
        V.check_states("final_states_out", final_states_out, x, B, D, weight.shape[1], False, TORCH)
    k = for_tensor(x)
    cl = is_channel_last(x)
    # a strided x (Mamba's xz.chunk(2, dim=1) halves) as it is where the module allows
    x = for_kernel(x, cl, k.strided_x)
    if initial_states is not None:
        scl = is_channel_last(initial_states)
        initial_states = for_kernel(initial_states, scl)
    elif final_states_out is not None:
        scl = is_channel_last(final_states_out)
    else:
        scl = cl  # Dao: final states follow x
    args = (x, weight.contiguous(), _contiguous(bias), _contiguous(seq_idx), initial_states,
            bool(return_final_states), 1 if act else 0, cl, scl)
    route = direct.path(args[:5] + (final_states_out,))
    if route == direct.PLAIN:
        out = (final_states_out if final_states_out is not None
               and is_dense(final_states_out, scl) else None)
        y, fs = impl.forward(*args, final_states_out=out)
        if out is not None:  # written by the kernel
            direct.bump_version(out)
    elif route == direct.AUTOGRAD:
        y, fs = direct.EagerConv.apply(*args)
    else:
        y, fs = ops.fwd_op(*args)
    if not return_final_states:
        return y
    if final_states_out is not None and fs is not final_states_out:
        final_states_out.copy_(fs)
        fs = final_states_out
    return y, fs


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """Decode step (Dao's ``causal_conv1d_update``), updating ``conv_state`` in place.

    x: (batch, dim) or (batch, dim, seqlen); conv_state: (num_slots, dim,
    state_len) with state_len >= width - 1, channel-last when a transposed
    (num_slots, state_len, dim) view; one slot per row, or any number with
    conv_state_indices; weight: (dim, width); bias: (dim,); cache_seqlens:
    (batch,) int32, the state is then a circular buffer; conv_state_indices:
    (batch,) int32 state slot per row, -1 for padding rows (zero output, no
    state change).

    Returns out, shaped like x. Not differentiable.
    """
    _tensors(x, (("conv_state", conv_state), ("weight", weight), ("bias", bias),
                 ("cache_seqlens", cache_seqlens), ("conv_state_indices", conv_state_indices)))
    act = V.check_update(x, conv_state, weight, bias, cache_seqlens, conv_state_indices,
                         activation, False, TORCH)
    k = for_tensor(x)
    cl = k.channels_last_decode and is_channel_last(conv_state)
    # The kernels need the state dense in one of their layouts; otherwise
    # they work on a dense copy, written back (a strided pool is rare).
    state = conv_state if is_dense(conv_state, cl) else for_kernel(conv_state, cl)
    x = tokens_for_kernel(x, k.strided_x) if x.dim() == 2 else for_kernel(x, cl, k.strided_x)
    args = (x, state, weight.contiguous(), _contiguous(bias), 1 if act else 0,
            _contiguous(cache_seqlens), _contiguous(conv_state_indices), cl)
    if direct.path(args[:4] + args[5:7]) == direct.PLAIN:  # (not differentiable)
        y = impl.update(*args)
        direct.bump_version(state)
    else:
        y = ops.update_op(*args)
    if state is not conv_state:
        conv_state.copy_(state)
    return y


def causal_conv1d_varlen_states(x, cu_seqlens, state_len):
    """The last ``state_len`` inputs of each packed sequence, zero-padded on
    the left (Dao's ``causal_conv1d_varlen_states``).

    x: (total_tokens, dim); cu_seqlens: (batch + 1,) integer offsets from 0
    to total_tokens, non-decreasing. Returns (batch, dim, state_len), stored
    channel-last as Dao's is (when the kernels support that layout; else
    contiguous, with the same values). Forward only.
    """
    _tensors(x, (("cu_seqlens", cu_seqlens),))
    V.check_varlen_states(x, cu_seqlens, state_len, False, TORCH)
    k = for_tensor(x)
    args = (tokens_for_kernel(x, k.strided_x), cu_seqlens.int().contiguous(), int(state_len),
            k.channels_last_decode)
    if direct.path(args[:2]) == direct.PLAIN:
        return impl.varlen_states(*args)
    return ops.varlen_states_op(*args)
