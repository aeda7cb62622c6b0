"""The pure-XLA twin of each FFI target, in the same argument convention
(config.py), built from jax_causal_conv.reference: what runs on platforms
without our kernels (TPU, ROCm) and for ``backend="xla"`` inside vmap rules."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from .. import reference
from .config import VARLEN, fold, split_groups
from .dispatch import to_varying, union_vma


def forward(cfg, x, w, b, res, seq_idx, cu, init):
    G = w.shape[0]
    if cfg.mode == VARLEN:
        N = cu.shape[1] - 1
        init_rows = None if init is None else init.reshape((x.shape[0], N) + init.shape[1:])

        def row(xr, wg, bg, cur, ir):
            return reference.causal_conv1d_varlen(
                xr, wg, bg, cu_seqlens=cur, activation=cfg.activation, initial_states=ir,
                return_final_states=True)
        per_group = jax.vmap(row, in_axes=(0, None, None, 0, 0))
        y, fin = jax.vmap(per_group)(split_groups(x, G), w, b, split_groups(cu, G),
                                     split_groups(init_rows, G))
        fin = fin.reshape((fin.shape[0] * fin.shape[1] * fin.shape[2],) + fin.shape[3:])
    else:
        def group(xg, wg, bg, rg, sg, ig):
            return reference.causal_conv1d(
                xg, wg, bg, activation=cfg.activation, residual=rg, seq_idx=sg,
                initial_states=ig, return_final_states=True, channels_last=cfg.channels_last)
        y, fin = jax.vmap(group)(split_groups(x, G), w, b,
                                 *[split_groups(a, G) for a in (res, seq_idx, init)])
        fin = fold(fin)
    return y.reshape(x.shape), (fin if cfg.want_final else None)


def backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    cfg = dataclasses.replace(cfg, want_final=dfin is not None)
    # per-shard partial gradients, like the kernel's (the caller sums them)
    x, w, b, init = to_varying((x, w, b, init), union_vma((x, w, b, seq_idx, cu, init, dy, dfin)))
    _, vjp = jax.vjp(lambda x, w, b, init: forward(cfg, x, w, b, None, seq_idx, cu, init),
                     x, w, b, init)
    return vjp((dy, dfin))


def update(cfg, x, state, w, b, cache, idx):
    G = w.shape[0]
    if G == 1:
        return reference.causal_conv1d_update(
            x, state, w[0], None if b is None else b[0], activation=cfg.activation,
            cache_seqlens=cache, conv_state_indices=idx, channels_last=cfg.channels_last)
    # Weight groups only arise from vmap, where each group owns its own rows
    # and slots (batching.py lays them out contiguously).
    N = state.shape[0] // G
    local = None if idx is None else jnp.where(idx >= 0, idx % max(N, 1), -1)
    xg, sg, cg, ig = (split_groups(a, G) for a in (x, state, cache, local))
    ys, states = jax.vmap(lambda xg, sg, wg, bg, cg, ig: reference.causal_conv1d_update(
        xg, sg, wg, bg, activation=cfg.activation, cache_seqlens=cg, conv_state_indices=ig,
        channels_last=cfg.channels_last))(
        xg, sg, w, b, cg, ig)
    return ys.reshape(x.shape), states.reshape(state.shape)


def varlen_states(state_len, x, cu, channels_last=False):
    return reference.varlen_final_states(x, cu, None, state_len, channels_last)
