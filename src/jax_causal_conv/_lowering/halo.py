"""One block of a sequence split over ``axes`` (n devices, block i holding
steps i*Ll .. (i+1)*Ll - 1), forward and backward.

Output t reads inputs t-W+1 .. t, so block i needs the last H = W-1 inputs of
block i-1 (its "halo"); they arrive with one ``ppermute`` of H columns (one
per block spanned when Ll < H), and block 0 takes the user's initial states
(or zeros). Neither big kernel call waits for the exchange: the block runs
with zero history and its first H outputs, the only ones that read the halo,
are recomputed from it by a small XLA call and written over (in place).
Backward: d(halo) comes from those first H outputs alone, travels back with
one ``ppermute`` and is added to the previous block's last H columns of d(x)
after its big kernel call. With ``seq_idx`` the halo's ids travel with it,
and the recomputed head masks history from other sequences exactly.

Final states: with ``return_final_states`` each block computes the final
states of its rows as if it were the end of the sequence; the block that
holds the row's end (the last one, or with ``seq_idx`` the last block with a
non-padding step) hands them to all with one all-reduce of (rows, D, H).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from . import kernels, xla_twins
from .config import ROWS, VARLEN


def _take(a, start, stop, ax):
    return lax.slice_in_dim(a, start, stop, axis=ax)


def exchange(a, H, ax, axes, n, fill=None):
    """The H entries along ``ax`` that precede this block in the global array
    (oldest first): from the previous blocks by ppermute, and for positions
    before the global start from ``fill`` (H entries) or zeros."""
    Ll = a.shape[ax]
    k = -(-H // Ll)
    parts = []
    for j in range(k, 0, -1):  # oldest first
        width = Ll if j < k else H - (k - 1) * Ll
        src = _take(a, Ll - width, Ll, ax)
        perm = [(s, s + j) for s in range(n - j)]
        parts.append(lax.ppermute(src, axes, perm) if perm else jnp.zeros_like(src))
    halo = parts[0] if k == 1 else jnp.concatenate(parts, axis=ax)
    if fill is not None:
        i = lax.axis_index(axes)
        m = jnp.arange(H)
        before = i * Ll - H + m < 0                      # global position < 0
        src = jnp.take(fill.astype(a.dtype), jnp.clip(i * Ll + m, 0, H - 1), axis=ax)
        shape = [1] * a.ndim
        shape[ax] = H
        halo = jnp.where(before.reshape(shape), src, halo)
    return halo


def exchange_ids(sidx, H, axes, n):
    """The halo's seq_idx; history before the global start has the id of the
    row's first step (SPEC: initial states belong to the first segment)."""
    Ll = sidx.shape[1]
    raw = exchange(sidx, H, 1, axes, n)
    n_before = jnp.clip(H - lax.axis_index(axes) * Ll, 0, H)
    # the global position 0 sits right after the positions before it
    first = jnp.take(jnp.concatenate([raw, sidx[:, :1]], axis=1), n_before, axis=1)
    return jnp.where(jnp.arange(H)[None, :] < n_before, first[:, None], raw)


# --- pieces ---------------------------------------------------------------------------

def _head(cfg, x, w, b, res, halo, t):
    """Outputs 0..H-1 of the block from [halo, x[:H]] (XLA's shifted sums)."""
    H = halo.shape[t]
    cfg = dataclasses.replace(cfg, want_final=False, mode=ROWS)
    return xla_twins.forward(cfg, _take(x, 0, H, t), w, b,
                             None if res is None else _take(res, 0, H, t), None, None, halo)[0]


@functools.lru_cache(maxsize=None)
def _seq_idx_conv(cfg):
    """The block's kernel call with seq_idx and zero history, differentiable."""
    cfg = dataclasses.replace(cfg, want_final=False)

    @jax.custom_vjp
    def conv(x, w, b, res, sidx):
        return kernels.forward(cfg, x, w, b, res, sidx, None, None)[0]

    def fwd(x, w, b, res, sidx):
        return conv(x, w, b, res, sidx), (x, w, b, res is not None, sidx)

    def bwd(saved, dy):
        x, w, b, has_res, sidx = saved
        dx, dw, db, _ = kernels.backward(cfg, x, w, b, sidx, None, None, dy, None)
        return dx, dw, db, (dy if has_res else None), None

    conv.defvjp(fwd, bwd)
    return conv


def _seq_idx_block(cfg, t, x, w, b, res, sidx, halo, shalo):
    """-> (y, final-state candidate or None): the block with seq_idx, its head
    recomputed from [halo, x] with the halo's ids."""
    H, Ll = halo.shape[t], x.shape[t]
    nh = min(H, Ll)
    y = _seq_idx_conv(cfg)(x, w, b, res, sidx)
    ext = jnp.concatenate([halo, _take(x, 0, nh, t)], axis=t)
    sext = jnp.concatenate([shalo, sidx[:, :nh]], axis=1)
    rext = None if res is None else jnp.concatenate(
        [jnp.zeros_like(halo), _take(res, 0, nh, t)], axis=t)
    hcfg = dataclasses.replace(cfg, want_final=False)
    head = _take(xla_twins.forward(hcfg, ext, w, b, rext, sext, None, None)[0], H, H + nh, t)
    y = lax.dynamic_update_slice_in_dim(y, head.astype(y.dtype), 0, t)
    if not cfg.want_final:
        return y, None
    # the last H inputs up to the block's last non-padding step e-1, those
    # with that step's id (xp = [halo, x], ids [shalo, sidx])
    valid = sidx >= 0
    e = Ll - jnp.argmax(valid[:, ::-1], axis=1)                      # (R,)
    s = jnp.take_along_axis(sidx, jnp.clip(e - 1, 0, Ll - 1)[:, None], axis=1)
    pos = e[:, None] - H + jnp.arange(H)[None, :]                     # (R, H) local steps
    inside = pos >= 0
    xi, hi = jnp.clip(pos, 0, Ll - 1), jnp.clip(pos + H, 0, H - 1)
    ids = jnp.where(inside, jnp.take_along_axis(sidx, xi, axis=1),
                    jnp.take_along_axis(shalo, hi, axis=1))
    keep = (ids == s) & valid.any(axis=1)[:, None]
    idx = (lambda a: a[:, None, :]) if t == 2 else (lambda a: a[:, :, None])
    vals = jnp.where(idx(inside), jnp.take_along_axis(x, idx(xi), axis=t),
                     jnp.take_along_axis(halo, idx(hi), axis=t))
    cand = jnp.where(idx(keep), vals, 0)
    # a row without non-padding steps returns its history (block 0: the
    # initial states) -- used only when no block has any
    cand = jnp.where(valid.any(axis=1)[:, None, None], cand, halo)
    return y, cand


def _owner(sidx, axes, n):
    """Per row, whether this block holds the row's final states."""
    i = lax.axis_index(axes)
    if sidx is None:
        return i == n - 1
    key = jnp.where((sidx >= 0).any(axis=1), i, 0)
    return (lax.pmax(key, axes) == i)[:, None, None]


def _hand_out(fin, owner, axes):
    return lax.psum(jnp.where(owner, fin, jnp.zeros_like(fin)), axes)


# --- forward and backward ---------------------------------------------------------------

def forward(cfg, axes, n, x, w, b, res, sidx, cu, init):
    if cfg.mode == VARLEN:
        return varlen_forward(cfg, axes, n, x, w, b, cu, init)
    t = 1 if cfg.channels_last else 2
    H, Ll = w.shape[-1] - 1, x.shape[t]
    halo = exchange(x, H, t, axes, n, fill=init)
    if sidx is not None:
        y, fin = _seq_idx_block(cfg, t, x, w, b, res, sidx, halo, exchange_ids(sidx, H, axes, n))
    elif Ll >= H:
        y, fin = kernels.forward(cfg, x, w, b, res, None, None, None)
        head = _head(cfg, x, w, b, res, halo, t)
        y = lax.dynamic_update_slice_in_dim(y, head.astype(y.dtype), 0, t)
    else:  # blocks shorter than the halo: the kernel reads it as its history
        y, fin = kernels.forward(cfg, x, w, b, res, None, None, halo)
    if fin is not None:
        fin = _hand_out(fin, _owner(sidx, axes, n), axes)
    return y, fin


def backward(cfg, axes, n, x, w, b, sidx, cu, init, dy, dfin):
    if cfg.mode == VARLEN:
        return varlen_backward(cfg, axes, n, x, w, b, cu, init, dy, dfin)
    t = 1 if cfg.channels_last else 2
    H, Ll = w.shape[-1] - 1, x.shape[t]
    i = lax.axis_index(axes)
    if init is None:
        halo, ex_vjp = jax.vjp(lambda x: exchange(x, H, t, axes, n), x)
    else:
        halo, ex_vjp = jax.vjp(lambda x, init: exchange(x, H, t, axes, n, fill=init), x, init)
    if dfin is not None:  # only the block that returned the final states gets their cotangent
        dfin = jnp.where(_owner(sidx, axes, n), dfin, jnp.zeros_like(dfin))

    if sidx is not None:
        shalo = exchange_ids(sidx, H, axes, n)
        _, block_vjp = jax.vjp(
            lambda x, w, b, h: _seq_idx_block(cfg, t, x, w, b, None, sidx, h, shalo), x, w, b,
            halo)
        dx, dw, db, dhalo = block_vjp((dy, dfin))
    elif Ll >= H:
        # d(halo) first (small), so that its exchange runs beside the big call
        _, head_vjp = jax.vjp(lambda h: _head(cfg, x, w, b, None, h, t), halo)
        (dhalo,) = head_vjp(_take(dy, 0, H, t))
        dx, dw, db, _ = kernels.backward(cfg, x, w, b, None, None, halo, dy, dfin)
    else:
        dx, dw, db, dhalo = kernels.backward(cfg, x, w, b, None, None, halo, dy, dfin)

    if Ll >= H:
        # d(halo) is the previous block's d(last H inputs): added in place
        recv = lax.ppermute(dhalo, axes, [(s + 1, s) for s in range(n - 1)])
        tail = _take(dx, Ll - H, Ll, t).astype(jnp.float32) + recv.astype(jnp.float32)
        dx = lax.dynamic_update_slice_in_dim(dx, tail.astype(dx.dtype), Ll - H, t)
        dinit = None if init is None else lax.psum(
            jnp.where(i == 0, dhalo, jnp.zeros_like(dhalo)), axes)
    else:  # the halo spans several blocks: autodiff of the exchange sends it back
        back = ex_vjp(dhalo.astype(halo.dtype))
        dx = dx + back[0]
        dinit = None if init is None else lax.psum(back[1], axes)
    return dx, dw, db, dinit


# --- packed sequences (causal_conv1d_varlen) split over tokens ---------------------------

@functools.lru_cache(maxsize=None)
def _varlen_conv(cfg):
    """The block's varlen kernel call, differentiable (states included)."""

    @jax.custom_vjp
    def conv(x, w, b, cu, init):
        return kernels.forward(cfg, x, w, b, None, None, cu, init)

    def fwd(x, w, b, cu, init):
        return conv(x, w, b, cu, init), (x, w, b, cu, init)

    def bwd(saved, cts):
        x, w, b, cu, init = saved
        dx, dw, db, dinit = kernels.backward(cfg, x, w, b, None, cu, init, *cts)
        return dx, dw, db, None, dinit

    conv.defvjp(fwd, bwd)
    return conv


def _varlen_block(cfg, axes, x, w, b, cu, init, halo):
    """The block's tokens as packed sequences clipped to the block; the one
    that runs into it from the previous block (n0) gets as history the halo
    from its own tokens and, before its start, its initial states."""
    R, Tl, D = x.shape
    N, H = cu.shape[1] - 1, halo.shape[1]
    start = lax.axis_index(axes) * Tl
    n0 = jnp.minimum(jnp.sum(cu[:, 1:] <= start, axis=1), N - 1)            # (R,)
    c0 = jnp.take_along_axis(cu, n0[:, None], axis=1)                        # (R, 1)
    p = start - H + jnp.arange(H)[None, :]                                   # (R, H) global
    rows = (jnp.zeros((R, N, D, H), x.dtype) if init is None
            else init.reshape(R, N, D, H))
    own = jnp.take_along_axis(rows, n0[:, None, None, None], axis=1)[:, 0]   # (R, D, H)
    hist = jnp.take_along_axis(own, jnp.clip(p - c0 + H, 0, H - 1)[:, None, :], axis=2)
    h0 = jnp.where((p >= c0)[:, None, :], jnp.swapaxes(halo, 1, 2), hist)
    rows = rows.at[jnp.arange(R), n0].set(h0)
    cu_local = jnp.clip(cu - start, 0, Tl)
    return _varlen_conv(cfg)(x, w, b, cu_local, rows.reshape(R * N, D, H))


def _varlen_owner(cu, Tl, axes):
    """Per sequence, whether this block holds its last token (empty ones: block 0)."""
    last = jnp.where(cu[:, 1:] > cu[:, :-1], (cu[:, 1:] - 1) // Tl, 0)
    return (last == lax.axis_index(axes)).reshape(-1, 1, 1)


def varlen_forward(cfg, axes, n, x, w, b, cu, init):
    H = w.shape[-1] - 1
    halo = exchange(x, H, 1, axes, n)
    y, fin = _varlen_block(cfg, axes, x, w, b, cu, init, halo)
    if fin is not None:
        fin = _hand_out(fin, _varlen_owner(cu, x.shape[1], axes), axes)
    return y, fin


def varlen_backward(cfg, axes, n, x, w, b, cu, init, dy, dfin):
    H, Tl = w.shape[-1] - 1, x.shape[1]
    halo, ex_vjp = jax.vjp(lambda x: exchange(x, H, 1, axes, n), x)
    if dfin is not None:
        dfin = jnp.where(_varlen_owner(cu, Tl, axes), dfin, jnp.zeros_like(dfin))
    cfg = dataclasses.replace(cfg, want_final=dfin is not None)
    if init is None:
        _, vjp = jax.vjp(lambda x, w, b, h: _varlen_block(cfg, axes, x, w, b, cu, None, h),
                         x, w, b, halo)
        (dx, dw, db, dhalo), dinit = vjp((dy, dfin)), None
    else:
        _, vjp = jax.vjp(lambda x, w, b, i, h: _varlen_block(cfg, axes, x, w, b, cu, i, h),
                         x, w, b, init, halo)
        dx, dw, db, dinit, dhalo = vjp((dy, dfin))
        dinit = lax.psum(dinit, axes)   # each block's sequences' (and n0's history) part
    if Tl >= H:
        recv = lax.ppermute(dhalo, axes, [(s + 1, s) for s in range(n - 1)])
        tail = _take(dx, Tl - H, Tl, 1).astype(jnp.float32) + recv.astype(jnp.float32)
        dx = lax.dynamic_update_slice_in_dim(dx, tail.astype(dx.dtype), Tl - H, 1)
    else:
        dx = dx + ex_vjp(dhalo.astype(halo.dtype))[0]
    return dx, dw, db, dinit
