"""Each entry point on one device's block, in the kernels' convention: our FFI
kernel where the platform has one, else its pure-XLA twin (dispatch.py)."""

from __future__ import annotations

import functools

from . import ffi_calls, xla_twins
from .dispatch import dispatch
from .routing import cpu_kernel_wins, gpu_kernel_wins


def _gpu_kernel_wins(cfg, x, w, init, backward=False):
    batch, dim, length = (x.shape[0], x.shape[-1], x.shape[-2]) if cfg.channels_last else x.shape[-3:]
    return gpu_kernel_wins(cfg, w.shape[-1], length, x.dtype.itemsize, batch, dim, backward, init is not None)


def forward(cfg, x, w, b, res, seq_idx, cu, init):
    return dispatch(cfg.backend, functools.partial(ffi_calls.forward, cfg),
                    functools.partial(xla_twins.forward, cfg), x.dtype,
                    x, w, b, res, seq_idx, cu, init,
                    gpu_kernel=_gpu_kernel_wins(cfg, x, w, init),
                    cpu_kernel=cpu_kernel_wins(cfg, w.shape[-1], init is not None, x.dtype, elements=x.size))


def backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    return dispatch(cfg.backend, functools.partial(ffi_calls.backward, cfg),
                    functools.partial(xla_twins.backward, cfg), x.dtype,
                    x, w, b, seq_idx, cu, init, dy, dfin,
                    gpu_kernel=_gpu_kernel_wins(cfg, x, w, init, backward=True),
                    cpu_kernel=cpu_kernel_wins(cfg, w.shape[-1], init is not None, x.dtype, backward=True,
                                               elements=x.size))


def update(cfg, x, state, w, b, cache, idx):
    return dispatch(cfg.backend, functools.partial(ffi_calls.update, cfg),
                    functools.partial(xla_twins.update, cfg), x.dtype,
                    x, state, w, b, cache, idx)


def varlen_states(state_len, backend, channels_last, x, cu):
    return dispatch(backend, functools.partial(ffi_calls.varlen_states, state_len,
                                               channels_last=channels_last),
                    functools.partial(xla_twins.varlen_states, state_len,
                                      channels_last=channels_last), x.dtype, x, cu)
