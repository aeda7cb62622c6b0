"""The plain implementations: torch tensors in, the compiled kernels run,
fresh tensors out. The custom ops (ops.py) wrap them for the dispatcher,
and the eager path (direct.py) calls them directly.

Tensor arguments are logical Dao shapes, (batch, dim, len), with layout
flags saying how they are stored (channels_last: as (batch, len, dim)),
already readable by the kernels: x dense in its layout (or strided where
the module allows), other arrays dense. Every output is a fresh tensor,
never a view (layout.empty).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernels import bias_cap, cap, for_tensor, launch, weight_cap
from .layout import empty, for_kernel, kernel_view


def absent(like: Tensor) -> Tensor:
    """What an op returns for an output that is not there."""
    return like.new_empty((0,))


def forward(x, weight, bias, seq_idx, initial_states, return_final_states: bool, activation: int,
            channels_last: bool, states_channels_last: bool, final_states_out=None):
    """(y, final_states or None). x is readable by the kernels in its layout,
    weight/bias contiguous, initial_states (and final_states_out, written in
    place when given) dense in theirs."""
    B, D, L = x.shape
    dev = x.device
    k = for_tensor(x)
    y = empty(B, D, L, channels_last, x.dtype, dev)
    fs = None
    if return_final_states:
        fs = final_states_out
        if fs is None:
            fs = empty(B, D, weight.shape[1] - 1, states_channels_last, x.dtype, dev)
    launch(k, x, k.mod.fwd, cap(kernel_view(x, channels_last)), weight_cap(k, weight),
           bias_cap(k, bias), None, cap(seq_idx), None,
           cap(kernel_view(initial_states, states_channels_last)),
           cap(kernel_view(y, channels_last)), cap(kernel_view(fs, states_channels_last)),
           activation, 0 if seq_idx is None else 1, channels_last, states_channels_last)
    return y, fs


def backward_outputs(x, weight, bias, has_init, channels_last, states_channels_last):
    """The backward's fresh results (dx, dweight, dbias, dinitial_states),
    shared by the real op and its fake so that their layouts agree."""
    B, D, L = x.shape
    W = weight.shape[1]
    dev = x.device
    dx = empty(B, D, L, channels_last, x.dtype, dev)
    dw = torch.empty((D, W), dtype=weight.dtype, device=dev)
    db = torch.empty((D,), dtype=bias.dtype, device=dev) if bias is not None else absent(x)
    di = empty(B, D, W - 1, states_channels_last, x.dtype, dev) if has_init else absent(x)
    return dx, dw, db, di


def backward(x, weight, bias, seq_idx, initial_states, dy, dfinal_states, activation: int,
             channels_last: bool, states_channels_last: bool):
    """(dx, dweight, dbias, dinitial_states); dy and dfinal_states dense in
    their layouts; absent gradients are empty tensors."""
    cl, scl = channels_last, states_channels_last
    dx, dw, db, di = backward_outputs(x, weight, bias, initial_states is not None, cl, scl)
    dev = x.device
    k = for_tensor(x)
    mode = 0 if seq_idx is None else 1

    def problem():  # capsules are consumed by one call: fresh ones for each
        return (cap(kernel_view(x, cl)), weight_cap(k, weight), bias_cap(k, bias), cap(seq_idx),
                None, cap(kernel_view(initial_states, scl)))

    extra = ()
    if k.cuda:  # the kernels' scratch comes from torch's caching allocator
        nbytes = k.mod.bwd_workspace_bytes(*problem(), activation, mode, cl, scl)
        extra = (cap(torch.empty((max(int(nbytes), 1),), dtype=torch.uint8, device=dev)),)
    launch(k, x, k.mod.bwd, *problem(), cap(kernel_view(dy, cl)),
           cap(kernel_view(dfinal_states, scl)), cap(kernel_view(dx, cl)), weight_cap(k, dw),
           bias_cap(k, db if bias is not None else None),
           None if initial_states is None else cap(kernel_view(di, scl)),
           activation, mode, cl, scl, *extra)
    return dx, dw, db, di


def update_output(x, channels_last):
    """update's output: x's shape, (B, D) or (B, D, S), stored as (B, S, D)
    if channels_last; shared with the fake."""
    if x.dim() == 2:
        return torch.empty_strided(x.shape, (x.shape[1], 1), dtype=x.dtype, device=x.device)
    B, D, S = x.shape
    return empty(B, D, S, channels_last, x.dtype, x.device)


def update(x, conv_state, weight, bias, activation: int, cache_seqlens, conv_state_indices,
           channels_last: bool):
    """y for x (B, D) or (B, D, S); conv_state (num_slots, D, state_len),
    stored as (num_slots, state_len, D) if channels_last, is updated in place."""
    k = for_tensor(x)
    y = update_output(x, channels_last)
    if x.dim() == 3:
        xk, yk = cap(kernel_view(x, channels_last)), cap(kernel_view(y, channels_last))
    elif k.compact_args:
        xk, yk = cap(x), cap(y)
    else:  # one token: (B, D, 1), or (B, 1, D) channel-last: the same memory
        axis = 1 if channels_last else 2
        xk, yk = cap(x.unsqueeze(axis)), cap(y.unsqueeze(axis))
    args = (xk, cap(kernel_view(conv_state, channels_last)), weight_cap(k, weight),
            bias_cap(k, bias), cap(cache_seqlens), cap(conv_state_indices), yk, activation)
    if channels_last:
        launch(k, x, k.mod.update, *args, channels_last=True)
    else:
        launch(k, x, k.mod.update, *args)
    return y


def varlen_states(x, cu_seqlens, state_len: int, channels_last: bool):
    """(N, D, state_len), stored as (N, state_len, D) if channels_last."""
    dev = x.device
    k = for_tensor(x)
    states = empty(cu_seqlens.shape[0] - 1, x.shape[1], state_len, channels_last, x.dtype, dev)
    if channels_last:
        launch(k, x, k.mod.varlen_states, cap(x), cap(cu_seqlens),
               cap(kernel_view(states, True)), channels_last=True)
    else:
        launch(k, x, k.mod.varlen_states, cap(x), cap(cu_seqlens), cap(states))
    return states


def conv_backward(run_backward, saved, flags, dy, dfs):
    """The autograd formula of the forward, shared by the custom op and the
    eager autograd.Function: gradients (dx, dweight, dbias, dinitial_states;
    None where there is no such input) from the cotangents of y and of the
    final states (either may be None), through `run_backward` (backward or
    the backward op, same arguments)."""
    x, weight, bias, seq_idx, init = saved
    rfs, act, cl, scl = flags
    if dy is None:  # only the final states were used
        B, D, L = x.shape
        dy = empty(B, D, L, cl, x.dtype, x.device).zero_()
    else:
        dy = for_kernel(dy, cl)
    dfs = for_kernel(dfs, scl) if rfs and dfs is not None else None
    dx, dw, db, di = run_backward(x, weight, bias, seq_idx, init, dy, dfs, act, cl, scl)
    return dx, dw, (db if bias is not None else None), (di if init is not None else None)
