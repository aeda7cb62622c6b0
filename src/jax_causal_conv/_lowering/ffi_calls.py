"""One ``jax.ffi.ffi_call`` builder per FFI target, in the kernels' own
argument convention (see config.py): absent optional arrays become zero-size
placeholders flagged by ``has_*`` attributes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import targets
from .config import state_shape


def _placeholder(dtype):
    return jnp.zeros((0,), dtype)


def _conv_attrs(cfg):
    return dict(activation=np.int64(cfg.activation == "silu"), mode=np.int64(cfg.mode),
                channels_last=np.bool_(cfg.channels_last),
                states_channels_last=np.bool_(cfg.states_channels_last))


def _batch_len_dim(cfg, x):
    return x.shape if cfg.channels_last else (x.shape[0], x.shape[2], x.shape[1])


def forward(cfg, x, w, b, res, seq_idx, cu, init):
    B, L, _ = _batch_len_dim(cfg, x)
    fin_shape = state_shape(cfg, x, w, cu) if cfg.want_final else (0,)
    # Scratch for the CUDA kernels' mask words (channels-first seq_idx; empty
    # otherwise), allocated by XLA as the backward's is.
    ws = jax.ShapeDtypeStruct(
        (targets.forward_workspace_bytes(B, L, w.shape[-1], int(cfg.mode), cfg.channels_last),), jnp.uint8)
    call = jax.ffi.ffi_call(targets.FORWARD, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                              jax.ShapeDtypeStruct(fin_shape, x.dtype), ws))
    ph, ph_i = _placeholder(x.dtype), _placeholder(jnp.int32)
    y, fin, _ = call(x, w, ph if b is None else b, ph if res is None else res,
                     ph_i if seq_idx is None else seq_idx, ph_i if cu is None else cu,
                     ph if init is None else init, **_conv_attrs(cfg),
                     has_bias=np.bool_(b is not None), has_residual=np.bool_(res is not None),
                     has_initial_states=np.bool_(init is not None),
                     has_final_states=np.bool_(cfg.want_final))
    return y, (fin if cfg.want_final else None)


def backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    B, L, D = _batch_len_dim(cfg, x)
    # Scratch for the CUDA kernel's partial sums, allocated by XLA (the CPU
    # kernel ignores it): the kernels themselves allocate nothing.
    ws = jax.ShapeDtypeStruct((targets.backward_workspace_bytes(B, D, L, w.shape[-1]),), jnp.uint8)
    empty = jax.ShapeDtypeStruct((0,), x.dtype)
    outs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype),
            empty if b is None else jax.ShapeDtypeStruct(b.shape, b.dtype),
            empty if init is None else jax.ShapeDtypeStruct(init.shape, x.dtype),
            ws)
    ph, ph_i = _placeholder(x.dtype), _placeholder(jnp.int32)
    dx, dw, db, dinit, _ = jax.ffi.ffi_call(targets.BACKWARD, outs)(
        x, w, ph if b is None else b, ph_i if seq_idx is None else seq_idx,
        ph_i if cu is None else cu, ph if init is None else init, dy,
        ph if dfin is None else dfin, **_conv_attrs(cfg),
        has_bias=np.bool_(b is not None), has_initial_states=np.bool_(init is not None),
        has_dfinal_states=np.bool_(dfin is not None))
    return dx, dw, (None if b is None else db), (None if init is None else dinit)


# Inside a lax.scan over tokens, XLA folds the slice of xs and the write into
# ys into the update's custom call (a dynamic-slice fusion, the kernel
# addressing the stacked arrays). That keeps the loop body out of XLA's
# command buffers, so every step launches our kernel from the host. Larger
# steps make the loop device-bound, and there the fusion's saved copies win,
# so only steps up to this many bytes of x get an optimization barrier on x
# and on y, which keeps XLA from forming the fusion (on one side only it was
# worse than either) and costs nothing outside loops. The measurements are in
# docs/performance-log.md.
NO_SLICE_FUSION_MAX_BYTES = 1 << 20


def update(cfg, x, state, w, b, cache, idx):
    unfused = x.size * x.dtype.itemsize <= NO_SLICE_FUSION_MAX_BYTES
    if unfused:
        x = lax.optimization_barrier(x)
    ph, ph_i = _placeholder(x.dtype), _placeholder(jnp.int32)
    call = jax.ffi.ffi_call(
        targets.UPDATE, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                         jax.ShapeDtypeStruct(state.shape, state.dtype)),
        input_output_aliases={1: 1})
    y, s = call(x, state, w, ph if b is None else b, ph_i if cache is None else cache,
                ph_i if idx is None else idx, activation=np.int64(cfg.activation == "silu"),
                has_bias=np.bool_(b is not None), has_cache_seqlens=np.bool_(cache is not None),
                has_state_indices=np.bool_(idx is not None),
                channels_last=np.bool_(cfg.channels_last))
    if unfused:
        y = lax.optimization_barrier(y)
    return y, s


def varlen_states(state_len, x, cu, channels_last=False):
    N, D = cu.shape[0] - 1, x.shape[1]
    out = jax.ShapeDtypeStruct((N, state_len, D) if channels_last else (N, D, state_len), x.dtype)
    return jax.ffi.ffi_call(targets.VARLEN_STATES, out)(x, cu, channels_last=np.bool_(channels_last))

