"""The kernels as ``torch.library`` custom ops (namespace ``jax_causal_conv``)
with fake implementations and autograd formulas, so that ``torch.compile``
traces them without graph breaks and ``torch.autograd`` differentiates the
convolution.

Each op has a plain implementation (``forward``, ``backward``, ``update``,
``varlen_states``) that the eager path calls directly when nothing needs
the dispatcher (direct.py). Tensor arguments are logical Dao shapes,
(batch, dim, len), with the layout flags saying how they are stored; the
public functions (api.py) have already made them readable by the kernels,
and the ops' registered implementations make sure again (free when they
are). Every output is a fresh tensor, never a view (see layout.empty).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import direct
from .kernels import cap, for_device, launch
from .layout import empty, for_kernel, kernel_view, tokens_for_kernel

def _absent(like: Tensor) -> Tensor:
    return like.new_empty((0,))


# --- implementations --------------------------------------------------------------------


def forward(x, weight, bias, seq_idx, initial_states, return_final_states: bool, activation: int,
            channels_last: bool, states_channels_last: bool, final_states_out=None):
    """(y, final_states or None). x is readable by the kernels in its layout,
    weight/bias contiguous, initial_states (and final_states_out, written in
    place when given) dense in theirs."""
    B, D, L = x.shape
    dev = x.device
    k = for_device(dev)
    y = empty(B, D, L, channels_last, x.dtype, dev)
    fs = None
    if return_final_states:
        fs = final_states_out
        if fs is None:
            fs = empty(B, D, weight.shape[1] - 1, states_channels_last, x.dtype, dev)
    launch(k, dev, k.mod.fwd, cap(kernel_view(x, channels_last)), cap(weight.unsqueeze(0)),
           None if bias is None else cap(bias.unsqueeze(0)), None, cap(seq_idx), None,
           cap(kernel_view(initial_states, states_channels_last)),
           cap(kernel_view(y, channels_last)), cap(kernel_view(fs, states_channels_last)),
           activation, 0 if seq_idx is None else 1, channels_last, states_channels_last)
    return y, fs


def _bwd_outputs(x, weight, bias, has_init, channels_last, states_channels_last):
    """The backward's fresh results (dx, dweight, dbias, dinitial_states),
    shared by the real op and its fake so that their layouts agree."""
    B, D, L = x.shape
    W = weight.shape[1]
    dev = x.device
    dx = empty(B, D, L, channels_last, x.dtype, dev)
    dw = torch.empty((D, W), dtype=weight.dtype, device=dev)
    db = torch.empty((D,), dtype=bias.dtype, device=dev) if bias is not None else _absent(x)
    di = empty(B, D, W - 1, states_channels_last, x.dtype, dev) if has_init else _absent(x)
    return dx, dw, db, di


def backward(x, weight, bias, seq_idx, initial_states, dy, dfinal_states, activation: int,
             channels_last: bool, states_channels_last: bool):
    """(dx, dweight, dbias, dinitial_states); dy and dfinal_states dense in
    their layouts; absent gradients are empty tensors."""
    cl, scl = channels_last, states_channels_last
    dx, dw, db, di = _bwd_outputs(x, weight, bias, initial_states is not None, cl, scl)
    dev = x.device
    k = for_device(dev)
    mode = 0 if seq_idx is None else 1

    def problem():  # capsules are consumed by one call: fresh ones for each
        return (cap(kernel_view(x, cl)), cap(weight.unsqueeze(0)),
                None if bias is None else cap(bias.unsqueeze(0)), cap(seq_idx), None,
                cap(kernel_view(initial_states, scl)))

    extra = ()
    if k.cuda:  # the kernels' scratch comes from torch's caching allocator
        nbytes = k.mod.bwd_workspace_bytes(*problem(), activation, mode, cl, scl)
        extra = (cap(torch.empty((max(int(nbytes), 1),), dtype=torch.uint8, device=dev)),)
    launch(k, dev, k.mod.bwd, *problem(), cap(kernel_view(dy, cl)),
           cap(kernel_view(dfinal_states, scl)), cap(kernel_view(dx, cl)), cap(dw.unsqueeze(0)),
           None if bias is None else cap(db.unsqueeze(0)),
           None if initial_states is None else cap(kernel_view(di, scl)),
           activation, mode, cl, scl, *extra)
    return dx, dw, db, di


def update(x, conv_state, weight, bias, activation: int, cache_seqlens, conv_state_indices,
           channels_last: bool):
    """y for x (B, D, S); conv_state (num_slots, D, state_len), stored as
    (num_slots, state_len, D) if channels_last, is updated in place."""
    B, D, S = x.shape
    dev = x.device
    k = for_device(dev)
    y = empty(B, D, S, channels_last, x.dtype, dev)
    args = (cap(kernel_view(x, channels_last)), cap(kernel_view(conv_state, channels_last)),
            cap(weight.unsqueeze(0)), None if bias is None else cap(bias.unsqueeze(0)),
            cap(cache_seqlens), cap(conv_state_indices), cap(kernel_view(y, channels_last)),
            activation)
    if channels_last:
        launch(k, dev, k.mod.update, *args, channels_last=True)
    else:
        launch(k, dev, k.mod.update, *args)
    return y


def varlen_states(x, cu_seqlens, state_len: int, channels_last: bool):
    """(N, D, state_len), stored as (N, state_len, D) if channels_last."""
    dev = x.device
    k = for_device(dev)
    states = empty(cu_seqlens.shape[0] - 1, x.shape[1], state_len, channels_last, x.dtype, dev)
    if channels_last:
        launch(k, dev, k.mod.varlen_states, cap(x), cap(cu_seqlens),
               cap(kernel_view(states, True)), channels_last=True)
    else:
        launch(k, dev, k.mod.varlen_states, cap(x), cap(cu_seqlens), cap(states))
    return states


# --- custom ops -------------------------------------------------------------------------


def _strided_ok(x: Tensor) -> bool:
    return x.device.type in ("cpu", "cuda") and for_device(x.device).strided_x


@torch.library.custom_op("jax_causal_conv::causal_conv1d_fwd", mutates_args=())
def fwd_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
           initial_states: Optional[Tensor], return_final_states: bool, activation: int,
           channels_last: bool, states_channels_last: bool) -> tuple[Tensor, Tensor]:
    x = for_kernel(x, channels_last, _strided_ok(x))
    init = None if initial_states is None else for_kernel(initial_states, states_channels_last)
    y, fs = forward(x, weight.contiguous(), None if bias is None else bias.contiguous(),
                    None if seq_idx is None else seq_idx.contiguous(), init, return_final_states,
                    activation, channels_last, states_channels_last)
    return y, (fs if fs is not None else _absent(x))


@fwd_op.register_fake
def _fwd_fake(x, weight, bias, seq_idx, initial_states, return_final_states, activation,
              channels_last, states_channels_last):
    B, D, L = x.shape
    y = empty(B, D, L, channels_last, x.dtype, x.device)
    fs = (empty(B, D, weight.shape[1] - 1, states_channels_last, x.dtype, x.device)
          if return_final_states else _absent(x))
    return y, fs


@torch.library.custom_op("jax_causal_conv::causal_conv1d_bwd", mutates_args=())
def bwd_op(x: Tensor, weight: Tensor, bias: Optional[Tensor], seq_idx: Optional[Tensor],
           initial_states: Optional[Tensor], dy: Tensor, dfinal_states: Optional[Tensor],
           activation: int, channels_last: bool,
           states_channels_last: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    scl = states_channels_last
    return backward(
        for_kernel(x, channels_last, _strided_ok(x)), weight.contiguous(),
        None if bias is None else bias.contiguous(),
        None if seq_idx is None else seq_idx.contiguous(),
        None if initial_states is None else for_kernel(initial_states, scl),
        for_kernel(dy, channels_last), None if dfinal_states is None else for_kernel(dfinal_states, scl),
        activation, channels_last, scl)


@bwd_op.register_fake
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
    if dy is None:  # only the final states were used
        B, D, L = x.shape
        dy = empty(B, D, L, cl, x.dtype, x.device).zero_()
    else:
        dy = for_kernel(dy, cl)
    dfs = for_kernel(dfs, scl) if rfs and dfs is not None else None
    args = (x, weight, bias, seq_idx, init, dy, dfs, act, cl, scl)
    dx, dw, db, di = direct.call(bwd_op, backward, args)
    return (dx, dw, db if bias is not None else None, None,
            di if init is not None else None, None, None, None, None)


fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


@torch.library.custom_op("jax_causal_conv::causal_conv1d_update", mutates_args=("conv_state",))
def update_op(x: Tensor, conv_state: Tensor, weight: Tensor, bias: Optional[Tensor],
              activation: int, cache_seqlens: Optional[Tensor],
              conv_state_indices: Optional[Tensor], channels_last: bool) -> Tensor:
    return update(for_kernel(x, channels_last, _strided_ok(x)), conv_state, weight.contiguous(),
                  None if bias is None else bias.contiguous(),
                  activation, None if cache_seqlens is None else cache_seqlens.contiguous(),
                  None if conv_state_indices is None else conv_state_indices.contiguous(),
                  channels_last)


@update_op.register_fake
def _update_fake(x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices,
                 channels_last):
    B, D, S = x.shape
    return empty(B, D, S, channels_last, x.dtype, x.device)


@torch.library.custom_op("jax_causal_conv::causal_conv1d_varlen_states", mutates_args=())
def varlen_states_op(x: Tensor, cu_seqlens: Tensor, state_len: int,
                     channels_last: bool) -> Tensor:
    return varlen_states(tokens_for_kernel(x, _strided_ok(x)), cu_seqlens.contiguous(), state_len,
                         channels_last)


@varlen_states_op.register_fake
def _varlen_states_fake(x, cu_seqlens, state_len, channels_last):
    return empty(cu_seqlens.shape[0] - 1, x.shape[1], state_len, channels_last, x.dtype, x.device)
