"""The kernels as ``torch.library`` custom ops (namespace ``jax_causal_conv``)
with fake implementations and autograd formulas, so that ``torch.compile``
traces them without graph breaks and ``torch.autograd`` differentiates the
convolution under tracing and functorch transforms. (Eager calls take the
shortcuts of direct.py when they can.)

The public functions (api.py) hand over tensors the kernels can read; the
registered implementations make sure again (free when they are), since a
compiled graph may pass other strides.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import direct, impl
from .impl import absent, backward_outputs, update_output
from .kernels import for_tensor
from .layout import empty, for_kernel, tokens_for_kernel


# --- custom ops -------------------------------------------------------------------------


def _strided_ok(x: Tensor) -> bool:
    return for_tensor(x).strided_x


@torch.library.custom_op("jax_causal_conv::causal_conv1d_fwd", mutates_args=())
def fwd_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
           initial_states: Optional[Tensor], return_final_states: bool, activation: int,
           channels_last: bool, states_channels_last: bool) -> tuple[Tensor, Tensor]:
    x = for_kernel(x, channels_last, _strided_ok(x))
    init = None if initial_states is None else for_kernel(initial_states, states_channels_last)
    y, fs = impl.forward(x, weight.contiguous(), None if bias is None else bias.contiguous(),
                    None if seq_idx is None else seq_idx.contiguous(), init, return_final_states,
                    activation, channels_last, states_channels_last)
    return y, (fs if fs is not None else absent(x))


@fwd_op.register_fake
def _fwd_fake(x, weight, bias, seq_idx, initial_states, return_final_states, activation,
              channels_last, states_channels_last):
    B, D, L = x.shape
    y = empty(B, D, L, channels_last, x.dtype, x.device)
    fs = (empty(B, D, weight.shape[1] - 1, states_channels_last, x.dtype, x.device)
          if return_final_states else absent(x))
    return y, fs


@torch.library.custom_op("jax_causal_conv::causal_conv1d_bwd", mutates_args=())
def bwd_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
           initial_states: Optional[Tensor], dy: Tensor, dfinal_states: Optional[Tensor],
           activation: int, channels_last: bool,
           states_channels_last: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    scl = states_channels_last
    return impl.backward(
        for_kernel(x, channels_last, _strided_ok(x)), weight.contiguous(),
        None if bias is None else bias.contiguous(),
        None if seq_idx is None else seq_idx.contiguous(),
        None if initial_states is None else for_kernel(initial_states, scl),
        for_kernel(dy, channels_last), None if dfinal_states is None else for_kernel(dfinal_states, scl),
        activation, channels_last, scl)


@bwd_op.register_fake
def _bwd_fake(x, weight, bias, seq_idx, initial_states, dy, dfinal_states, activation,
              channels_last, states_channels_last):
    return backward_outputs(x, weight, bias, initial_states is not None, channels_last,
                        states_channels_last)


def _fwd_setup_context(ctx, inputs, output):
    x, weight, bias, seq_idx, init, rfs, act, cl, scl = inputs
    ctx.save_for_backward(x, weight, bias, seq_idx, init)
    ctx.flags = (rfs, act, cl, scl)


def _run_backward(*args):
    if direct.path(args[:7]) == direct.PLAIN:
        return impl.backward(*args)
    return bwd_op(*args)


def _fwd_backward(ctx, dy, dfs):
    dx, dw, db, di = impl.conv_backward(_run_backward, ctx.saved_tensors, ctx.flags, dy, dfs)
    return dx, dw, db, None, di, None, None, None, None


fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


@torch.library.custom_op("jax_causal_conv::causal_conv1d_update", mutates_args=("conv_state",))
def update_op(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor],
              activation: int, cache_seqlens: Optional[Tensor],
              conv_state_indices: Optional[Tensor], channels_last: bool) -> Tensor:
    x = (tokens_for_kernel(x, _strided_ok(x)) if x.dim() == 2
         else for_kernel(x, channels_last, _strided_ok(x)))
    return impl.update(x, conv_state, weight.contiguous(),
                  None if bias is None else bias.contiguous(),
                  activation, None if cache_seqlens is None else cache_seqlens.contiguous(),
                  None if conv_state_indices is None else conv_state_indices.contiguous(),
                  channels_last)


@update_op.register_fake
def _update_fake(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices,
                 channels_last):
    return update_output(x, channels_last)


@torch.library.custom_op("jax_causal_conv::causal_conv1d_varlen_states", mutates_args=())
def varlen_states_op(x: Tensor, cu_seqlens: Tensor, state_len: int,
                     channels_last: bool) -> Tensor:
    return impl.varlen_states(tokens_for_kernel(x, _strided_ok(x)), cu_seqlens.contiguous(), state_len,
                         channels_last)


@varlen_states_op.register_fake
def _varlen_states_fake(x, cu_seqlens, state_len, channels_last):
    return empty(cu_seqlens.shape[0] - 1, x.shape[1], state_len, channels_last, x.dtype, x.device)
