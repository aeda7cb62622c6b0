"""What each device computes on its block of the arrays, for the four entry
points. partitioning.py decides the blocks; these functions receive them
(with any leading vmap axes still there), fold the leading axes into the
kernel's batch locally, run the kernel (or its XLA twin) and add the
communication the split needs: none for batch and channel splits, a sum of
d(weight)/d(bias) over the axes that split the rows, and for a split
sequence the halo exchange of halo.py."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax import lax

from . import halo, kernels


@dataclasses.dataclass(frozen=True)
class Split:
    """The mesh axes that split each factor (a dimension name of the sharding
    rules: "b" batch rows, "d" channels, "l" sequence, "n" state slots, "v0",
    "v1", ... leading vmap axes), and the mesh's axis sizes."""
    axes: tuple  # ((factor, (mesh axis, ...)), ...)
    sizes: tuple  # ((mesh axis, size), ...)

    def of(self, factor):
        return dict(self.axes).get(factor, ())

    def count(self, factor):
        sizes = dict(self.sizes)
        return math.prod(sizes[a] for a in self.of(factor))


# --- local folding of the leading (vmap) axes -------------------------------------

def fold(a, k):
    """(*V, m, ...) -> (prod(V) * m, ...) for the k leading axes V."""
    if a is None or k == 0:
        return a
    return a.reshape((math.prod(a.shape[:k + 1]),) + a.shape[k + 1:])


def unfold(a, lead):
    if a is None or not lead:
        return a
    return a.reshape(tuple(lead) + (a.shape[0] // math.prod(lead),) + a.shape[1:])


def _lead(a, base_ndim):
    return 0 if a is None else a.ndim - base_ndim


def _psum(a, axes):
    return a if a is None or not axes else lax.psum(a, axes)


# --- full-sequence convolution ------------------------------------------------------

def forward(cfg, split, x, w, b, res, seq_idx, cu, init):
    k, kw = _lead(x, 3), _lead(w, 3)
    lead = x.shape[:k]
    x, res, seq_idx, cu, init = (fold(a, k) for a in (x, res, seq_idx, cu, init))
    w, b = fold(w, kw), fold(b, kw)
    if split.count("l") > 1 and w.shape[-1] > 1:
        y, fin = halo.forward(cfg, split.of("l"), split.count("l"), x, w, b, res, seq_idx, cu,
                              init)
    else:
        y, fin = kernels.forward(cfg, x, w, b, res, seq_idx, cu, init)
        if fin is not None and split.count("l") > 1:  # W = 1: empty states
            fin = jnp.zeros_like(fin)
    return unfold(y, lead), unfold(fin, lead)


def backward(cfg, split, x, w, b, seq_idx, cu, init, dy, dfin):
    k = _lead(x, 3)
    lead = x.shape[:k]
    x, seq_idx, cu, init, dy, dfin, w, b = (fold(a, k) for a in
                                            (x, seq_idx, cu, init, dy, dfin, w, b))
    if split.count("l") > 1 and w.shape[-1] > 1:
        dx, dw, db, dinit = halo.backward(cfg, split.of("l"), split.count("l"), x, w, b,
                                          seq_idx, cu, init, dy, dfin)
    else:
        dx, dw, db, dinit = kernels.backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin)
    # the weights are shared by every row and step: one sum over the axes
    # that split the rows or the sequence (per mapped item: w has their axes)
    rows = split.of("b") + split.of("l")
    dw, db = _psum(dw, rows), _psum(db, rows)
    return tuple(unfold(a, lead) for a in (dx, dw, db, dinit))


# --- decoding -----------------------------------------------------------------------

def update(cfg, split, blocked, x, state, w, b, cache, idx):
    """``blocked``: rows and slots are split over the same axes, row shard j
    owning slot block j (a row pointing outside its block is a padding row).
    Otherwise every device holds all rows and its block of slots, serves the
    rows whose slot it owns, and the outputs are summed over the slot axes."""
    k, kw = _lead(x, 3), _lead(w, 3)
    lead = x.shape[:k]
    B, N = x.shape[k], state.shape[k]
    slot_axes = split.of("n")
    if idx is None and (slot_axes or k):  # (else the kernels' own default, slot = row: no iota a call)
        idx = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32), lead + (B,))
        if blocked and slot_axes:  # global row numbers are the slot numbers
            idx = idx + lax.axis_index(slot_axes) * B
    if slot_axes:  # global slot numbers -> this block's
        local = idx - lax.axis_index(slot_axes) * N
        idx = jnp.where((idx >= 0) & (local >= 0) & (local < N), local, -1)
    if k:  # each mapped item owns its own N slots in the folded pool
        offset = (jnp.arange(math.prod(lead), dtype=jnp.int32) * N).reshape(lead + (1,))
        idx = jnp.where((idx >= 0) & (idx < N), idx + offset, -1)
    x, state, cache, idx = (fold(a, k) for a in (x, state, cache, idx))
    w, b = fold(w, kw), fold(b, kw)
    y, new_state = kernels.update(cfg, x, state, w, b, cache, idx)
    if slot_axes and not blocked:
        y = lax.psum(y, slot_axes)
    return unfold(y, lead), unfold(new_state, lead)


def varlen_states(state_len, backend, channels_last, split, x, cu):
    k = _lead(x, 2)
    lead = x.shape[:k]
    if split.count("l") > 1:
        return _varlen_states_split(state_len, channels_last, split.of("l"), x, cu)
    if k:  # the mapped items' packs, one after the other, as one longer pack
        n, T = math.prod(lead), x.shape[k]
        cu = cu.reshape((n, cu.shape[-1]))
        starts = cu[:, :-1] + (jnp.arange(n, dtype=cu.dtype) * T)[:, None]
        # (no constant arrays: custom_partitioning traces without them)
        cu = jnp.concatenate([starts.reshape(-1), jnp.full((1,), n * T, cu.dtype)])
        x = x.reshape((n * T,) + x.shape[k + 1:])
    out = kernels.varlen_states(state_len, backend, channels_last, x, cu)
    return unfold(out, lead)


def _varlen_states_split(state_len, channels_last, axes, x, cu):
    """Tokens split over ``axes``: each device fills in the positions of every
    sequence's last ``state_len`` tokens that it holds, zeros elsewhere, and
    one sum over ``axes`` (of the (N, D, state_len) states) completes them."""
    T = x.shape[-2]
    start = lax.axis_index(axes) * T

    def one(x, cu):  # x (T, D) block, cu (N+1,) global offsets
        pos = cu[1:, None] - state_len + jnp.arange(state_len)[None, :]   # (N, SL) global
        loc = pos - start
        mine = (pos >= cu[:-1, None]) & (loc >= 0) & (loc < T)
        v = jnp.where(mine[..., None], x[jnp.clip(loc, 0, T - 1)], 0)      # (N, SL, D)
        return v if channels_last else jnp.swapaxes(v, 1, 2)

    f = one
    for _ in range(x.ndim - 2):
        f = jax.vmap(f)
    return lax.psum(f(x, cu), axes)
