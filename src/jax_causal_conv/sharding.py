"""Sharded entry points: the kernels under ``shard_map`` on a device mesh.

An FFI custom call is opaque to XLA's partitioner: handed sharded arrays, a
plain ``jcc.causal_conv1d`` gets them all-gathered first. These wrappers run
the kernel per shard instead (see docs/sharding.md):

- batch and channel sharding: every shard is independent (depthwise conv), no
  communication in the forward or in d(x); d(weight) and d(bias) are summed over
  the batch (and sequence) axes, as for any weight shared by sharded rows.
- sequence sharding (context parallelism): shard ``i`` needs the ``W-1`` inputs
  before its first step, which live on shard ``i-1``. They travel with one
  ``lax.ppermute`` of ``W-1`` columns and enter the local kernel as its
  ``initial_states`` (shard 0 takes the user's ``initial_states``, or zeros).
  In the backward, each shard's d(halo) travels back with one ppermute and
  enters the previous shard's backward kernel as d(final states), so that the
  kernel adds it to d(x) in its single pass (see ``_seq_shard_conv``).

All four compose with ``jit``, ``grad`` and ``vmap``. Axis arguments take a
mesh axis name, a tuple of names (the dimension is split over their product,
in that order), or ``None`` (not sharded: replicated over the mesh).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from . import reference
from . import validation as V
from .conv import causal_conv1d, causal_conv1d_varlen
from .decode import causal_conv1d_update, causal_conv1d_varlen_states

__all__ = [
    "causal_conv1d_sharded",
    "causal_conv1d_update_sharded",
    "causal_conv1d_varlen_sharded",
    "causal_conv1d_varlen_states_sharded",
]


# --- helpers ------------------------------------------------------------------

def _shard_map(f, mesh, in_specs, out_specs):
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=True)
    from jax.experimental.shard_map import shard_map  # jax < 0.7
    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=True)


def _norm_axis(mesh, axis, arg):
    """None | name | tuple of names -> None | name | tuple, checked against the mesh."""
    if axis is None or axis == ():
        return None
    names = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    for n in names:
        if n not in mesh.shape:
            raise ValueError(f"{arg}={axis!r}: mesh has no axis {n!r} "
                             f"(its axes are {tuple(mesh.shape)})")
    return names[0] if len(names) == 1 else names


def _axis_names(axis):
    return () if axis is None else (axis if isinstance(axis, tuple) else (axis,))


def _axis_size(mesh, axis):
    return math.prod(mesh.shape[n] for n in _axis_names(axis))


def _check_axes(mesh, **axes):
    seen = {}
    for arg, axis in axes.items():
        for n in _axis_names(axis):
            if n in seen:
                raise ValueError(f"mesh axis {n!r} is used by both {seen[n]} and {arg}")
            seen[n] = arg


def _check_divides(mesh, axis, arg, size, what):
    n = _axis_size(mesh, axis)
    if axis is not None and size % n:
        raise ValueError(f"{arg}={axis!r} splits {what} over {n} devices, but {what} = {size} "
                         f"is not divisible by {n}")


def _take(a, start, stop, ax):
    return lax.slice_in_dim(a, start, stop, axis=ax)


def _explicit(mesh):
    kind = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    return kind is not None and kind in tuple(getattr(mesh, "axis_types", ()))


def _run(mesh, body, args, specs, out_specs):
    """shard_map over the present (non-None) args; body gets the full list back.

    Under an Auto mesh XLA reshards misplaced inputs on the way in; an Explicit
    mesh (``jax.make_mesh``'s default in recent jax) types shardings, and
    shard_map rejects a mismatch, so the inputs are resharded here (a no-op for
    inputs already placed as ``specs`` says)."""
    present = [i for i, a in enumerate(args) if a is not None]
    if _explicit(mesh):
        args = list(args)
        for i in present:
            args[i] = jax.sharding.reshard(args[i], NamedSharding(mesh, specs[i]))

    def inner(*vals):
        full = list(args)
        for i, v in zip(present, vals):
            full[i] = v
        return body(*full)

    return _shard_map(inner, mesh, tuple(specs[i] for i in present), out_specs)(
        *[args[i] for i in present])


def _vary(a, axis):
    """Type ``a`` as varying over ``axis`` (no runtime op; its transpose is the psum)."""
    if a is None:
        return None
    names = _axis_names(axis)
    return lax.pcast(a, names, to="varying") if hasattr(lax, "pcast") else lax.pvary(a, names)


def _halo(a, H, ax, axis, n_dev, fill=None):
    """The H entries along ``ax`` that precede this shard's block in the global
    array, gathered from the previous shards with ppermute (one exchange of H
    columns when the local length is >= H, else one per shard it spans).
    Positions before the global start come from ``fill`` (H entries, replicated
    over ``axis``) or are zeros."""
    Ll = a.shape[ax]
    k = -(-H // Ll)
    parts = []
    for j in range(k, 0, -1):  # oldest first
        width = Ll if j < k else H - (k - 1) * Ll
        src = _take(a, Ll - width, Ll, ax)
        perm = [(s, s + j) for s in range(n_dev - j)]
        parts.append(lax.ppermute(src, axis, perm) if perm else jnp.zeros_like(src))
    halo = parts[0] if k == 1 else jnp.concatenate(parts, axis=ax)
    if fill is not None:
        i = lax.axis_index(axis)
        m = jnp.arange(H)
        before = i * Ll - H + m < 0                      # global position < 0
        src = jnp.take(fill.astype(a.dtype), jnp.clip(i * Ll + m, 0, H - 1), axis=ax)
        shape = [1] * a.ndim
        shape[ax] = H
        halo = jnp.where(before.reshape(shape), src, halo)
    return halo


# --- full-sequence convolution -----------------------------------------------------

def _seq_shard_conv(H, t_ax, sa, n_seq, kw):
    """One sequence shard's conv, (x, w, b, residual, initial_states) -> (y, final
    states), with the previous shard's last H inputs as its history (local
    length >= H, no seq_idx).

    Neither big kernel waits for a collective, so XLA can run the exchange
    beside it. Forward: the shard's call runs with zero history, and its first
    H outputs, the only ones that read the halo, are recomputed from the halo
    by a small call and written over (in place). Backward: the halo is saved
    from the forward; d(halo) comes from the first H steps alone (a small
    call), goes back to the previous shard, where it is the gradient of that
    shard's last H inputs (its final states) and is added to those H columns
    of d(x) after its big call. (Letting autodiff add d(halo) would pad it and
    add it over all of d(x): one more pass over the largest tensor.)"""
    xla = dict(kw, backend="xla")  # (B, D, H) problems: XLA's fused shifted sums

    def conv(x, w, b, res, halo):
        return causal_conv1d(x, w, b, residual=res, initial_states=halo,
                             return_final_states=True, **kw)

    def halo_of(x, init):
        return _halo(x, H, t_ax, sa, n_seq, fill=init)

    def head(x, w, b, res, halo):  # outputs 0..H-1, from the halo
        return causal_conv1d(_take(x, 0, H, t_ax), w, b, initial_states=halo,
                             residual=None if res is None else _take(res, 0, H, t_ax), **xla)

    def forward(x, w, b, res, init):
        y, fin = conv(x, w, b, res, None)
        halo = halo_of(x, init)
        y = lax.dynamic_update_slice_in_dim(y, head(x, w, b, res, halo).astype(y.dtype), 0, t_ax)
        return (y, fin), halo

    @jax.custom_vjp
    def run(x, w, b, res, init):
        return forward(x, w, b, res, init)[0]

    def run_fwd(x, w, b, res, init):
        out, halo = forward(x, w, b, res, init)
        return out, (x, w, b, res, init, halo)

    def run_bwd(saved, cts):
        x, w, b, res, init, halo = saved
        dy, dfin = cts
        # d(halo): only the first H steps read the history
        _, head_vjp = jax.vjp(lambda h: head(x, w, b, None, h), halo)
        (dhalo,) = head_vjp(_take(dy, 0, H, t_ax))
        # ... which is the previous shard's d(final states)
        recv = lax.ppermute(dhalo, sa, [(s + 1, s) for s in range(n_seq - 1)])
        _, vjp = jax.vjp(conv, x, w, b, res, halo)
        dx, dw, db, dres, _ = vjp((dy, dfin))
        Ll = x.shape[t_ax]
        tail = _take(dx, Ll - H, Ll, t_ax).astype(jnp.float32) + recv.astype(jnp.float32)
        dx = lax.dynamic_update_slice_in_dim(dx, tail.astype(dx.dtype), Ll - H, t_ax)
        # the user's initial_states reach shard 0's halo only (d(x) from this
        # path is the pad + add avoided above; unused, XLA drops it)
        _, fill_vjp = jax.vjp(halo_of, x, init)
        dinit = fill_vjp(dhalo)[1] if init is not None else None
        return dx, dw, db, dres, dinit

    run.defvjp(run_fwd, run_bwd)
    return run


def causal_conv1d_sharded(x, weight, bias=None, *, mesh, batch_axis=None, channel_axis=None,
                          seq_axis=None, activation=None, residual=None, seq_idx=None,
                          initial_states=None, return_final_states=False, channels_last=False,
                          backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d` with ``x`` split over ``mesh``.

    ``batch_axis``, ``channel_axis``, ``seq_axis``: the mesh axis (or tuple of
    axes) that splits B, D and L. ``x``, ``residual`` and ``y`` are sharded
    ``P(batch, channel, seq)`` (``P(batch, seq, channel)`` with
    ``channels_last``); ``weight`` ``P(channel, None)``; ``bias``
    ``P(channel)``; ``seq_idx`` ``P(batch, seq)``; ``initial_states`` and
    ``final_states`` ``P(batch, channel, None)`` (``P(batch, None, channel)``),
    replicated over the sequence axis. Inputs placed otherwise are resharded by
    XLA on the way in. Every other argument is that of ``causal_conv1d``.

    Communication: none for batch/channel sharding. With ``seq_axis``: one
    collective-permute of the ``W-1`` boundary columns of ``x`` (and of
    ``seq_idx`` when given) per call, its reverse in the backward, and with
    ``return_final_states`` one all-reduce of the (B, D, W-1) final states
    (which only the last shard holds) so that every shard returns them.
    """
    V.check_backend(backend)
    act = V.check_conv(x, weight, bias, residual, seq_idx, initial_states, channels_last,
                       activation)
    ba = _norm_axis(mesh, batch_axis, "batch_axis")
    ca = _norm_axis(mesh, channel_axis, "channel_axis")
    sa = _norm_axis(mesh, seq_axis, "seq_axis")
    _check_axes(mesh, batch_axis=ba, channel_axis=ca, seq_axis=sa)
    cl = bool(channels_last)
    B, L, D = (x.shape if cl else (x.shape[0], x.shape[2], x.shape[1]))
    _check_divides(mesh, ba, "batch_axis", B, "batch B")
    _check_divides(mesh, ca, "channel_axis", D, "channels D")
    _check_divides(mesh, sa, "seq_axis", L, "length L")
    W = weight.shape[-1]
    H = W - 1
    n_seq = _axis_size(mesh, sa)
    kw = dict(activation=act, channels_last=cl, backend=backend)

    x_spec = P(ba, sa, ca) if cl else P(ba, ca, sa)
    st_spec = P(ba, None, ca) if cl else P(ba, ca, None)
    specs = (x_spec, P(ca, None), P(ca), x_spec, P(ba, sa), st_spec)
    out_specs = (x_spec, st_spec) if return_final_states else x_spec
    t_ax = 1 if cl else 2
    args = (x, weight, bias, residual, seq_idx, initial_states)

    if sa is None or n_seq == 1 or H == 0 or 0 in x.shape:
        # Independent shards: the plain call on each (W = 1: nothing to exchange,
        # the final states are empty).
        def body(x, w, b, res, sidx, init):
            out = causal_conv1d(x, w, b, residual=res, seq_idx=sidx, initial_states=init,
                                return_final_states=return_final_states, **kw)
            if return_final_states and n_seq > 1:  # W = 1: empty, the same on every shard
                out = (out[0], jnp.zeros(out[1].shape, out[1].dtype))
            return out
        return _run(mesh, body, args, specs, out_specs)

    def body(x, w, b, res, sidx, init):
        Ll = x.shape[t_ax]
        if sidx is None and Ll >= H:
            y, fin = _seq_shard_conv(H, t_ax, sa, n_seq, kw)(x, w, b, res, init)
        elif sidx is None:
            halo = _halo(x, H, t_ax, sa, n_seq, fill=init)
            y, fin = causal_conv1d(x, w, b, residual=res, initial_states=halo,
                                   return_final_states=True, **kw)
        else:
            halo = _halo(x, H, t_ax, sa, n_seq, fill=init)
            # The kernel takes no history in seq_idx mode: run it on the shard
            # alone (its start treated as a sequence start), then recompute the
            # first min(W-1, Ll) outputs from [halo, head] with the halo's
            # seq_idx, which masks history belonging to other sequences.
            shalo = _halo(sidx, H, 1, sa, n_seq)
            # both calls use the weights: sum their gradients before the one
            # all-reduce over the batch and sequence axes (not one per call)
            wax = _axis_names(ba) + _axis_names(sa)
            w, b = _vary(w, wax), _vary(b, wax)
            n = min(H, Ll)
            ext = jnp.concatenate([halo, _take(x, 0, n, t_ax)], axis=t_ax)
            sext = jnp.concatenate([shalo, sidx[:, :n]], axis=1)
            rext = None
            if res is not None:
                rext = jnp.concatenate([jnp.zeros_like(halo), _take(res, 0, n, t_ax)], axis=t_ax)
            head = _take(causal_conv1d(ext, w, b, residual=rext, seq_idx=sext, **kw), H, H + n,
                         t_ax)
            if n == Ll:
                y = head
            else:
                y = causal_conv1d(x, w, b, residual=res, seq_idx=sidx, **kw)
                y = lax.dynamic_update_slice_in_dim(y, head, 0, axis=t_ax)
            # The row's last sequence may end on any shard: each shard takes
            # the final states of its own last valid token (from [halo, x]),
            # and the last shard holding a valid token hands them to all.
            ext_all = jnp.concatenate([halo, x], axis=t_ax)
            xp = jnp.concatenate([jnp.zeros_like(halo), ext_all], axis=t_ax)
            if cl:
                xp = jnp.swapaxes(xp, 1, 2)
            fin = reference._seq_final_states(xp, jnp.concatenate([shalo, sidx], axis=1), H, False)
            fin = jnp.swapaxes(fin, 1, 2) if cl else fin
            idx = lax.axis_index(sa)
            owner = lax.pmax(jnp.where(jnp.any(sidx >= 0, axis=1), idx, -1), sa)
            if not return_final_states:
                return y
            return y, lax.psum(jnp.where((owner == idx)[:, None, None], fin, 0).astype(fin.dtype), sa)
        if not return_final_states:
            return y
        # Only the last shard holds the true final states; hand them to all.
        last = lax.axis_index(sa) == n_seq - 1
        return y, lax.psum(jnp.where(last, fin, jnp.zeros_like(fin)), sa)

    return _run(mesh, body, args, specs, out_specs)


# --- decoding -----------------------------------------------------------------------

def causal_conv1d_update_sharded(x, conv_state, weight, bias=None, *, mesh, batch_axis=None,
                                 channel_axis=None, activation=None, cache_seqlens=None,
                                 conv_state_indices=None, backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d_update` with rows, state slots and/or
    channels split over ``mesh``; runs locally, no communication.

    ``x`` is sharded ``P(batch, channel[, None])``, ``conv_state``
    ``P(batch, channel, None)`` (the slot pool is cut into contiguous blocks, one
    per batch shard), ``weight`` ``P(channel, None)``, ``bias`` ``P(channel)``,
    ``cache_seqlens`` and ``conv_state_indices`` ``P(batch)``.

    ``conv_state_indices`` hold global slot numbers; with batch sharding, a row
    on batch shard ``k`` must use a slot of block ``k`` (slots ``k*N/n`` to
    ``(k+1)*N/n - 1``). A row pointing at another shard's block is treated as a
    padding row (zero output, no state touched) -- the slot pool is not
    communicated. Without ``conv_state_indices`` and with batch sharding the
    pool must have exactly one slot per row (N == B).
    """
    V.check_backend(backend)
    act = V.check_update(x, conv_state, weight, bias, cache_seqlens, conv_state_indices,
                         activation)
    ba = _norm_axis(mesh, batch_axis, "batch_axis")
    ca = _norm_axis(mesh, channel_axis, "channel_axis")
    _check_axes(mesh, batch_axis=ba, channel_axis=ca)
    B, D = x.shape[:2]
    N = conv_state.shape[0]
    _check_divides(mesh, ba, "batch_axis", B, "batch B")
    _check_divides(mesh, ba, "batch_axis", N, "the number of state slots")
    _check_divides(mesh, ca, "channel_axis", D, "channels D")
    n_b = _axis_size(mesh, ba)
    if ba is not None and n_b > 1 and conv_state_indices is None and N != B:
        raise ValueError(f"batch_axis={batch_axis!r} without conv_state_indices needs one state "
                         f"slot per row (num_slots == batch), got {N} slots for batch {B}: pass "
                         "conv_state_indices")
    x_spec = P(ba, ca) if x.ndim == 2 else P(ba, ca, None)
    specs = (x_spec, P(ba, ca, None), P(ca, None), P(ca), P(ba), P(ba))

    def body(x, st, w, b, cache, idx):
        if idx is not None and ba is not None and n_b > 1:
            n_loc = st.shape[0]
            local = idx - lax.axis_index(ba) * n_loc
            idx = jnp.where((idx >= 0) & (local >= 0) & (local < n_loc), local, -1)
        return causal_conv1d_update(x, st, w, b, activation=act, cache_seqlens=cache,
                                    conv_state_indices=idx, backend=backend)

    return _run(mesh, body, (x, conv_state, weight, bias, cache_seqlens, conv_state_indices),
                specs, (x_spec, P(ba, ca, None)))


# --- varlen -------------------------------------------------------------------------

def _varlen_axes(mesh, channel_axis, batch_axis, seq_axis, what):
    if batch_axis is not None or seq_axis is not None:
        raise NotImplementedError(
            f"{what} supports channel sharding only (channel_axis=...): packed sequences "
            "cross any token split, so split the channels, or use causal_conv1d_sharded "
            "with seq_idx for a (B, L) packing that can be split over batch and sequence")
    return _norm_axis(mesh, channel_axis, "channel_axis")


def causal_conv1d_varlen_sharded(x, weight, bias=None, *, cu_seqlens, mesh, channel_axis=None,
                                 batch_axis=None, seq_axis=None, activation=None,
                                 initial_states=None, return_final_states=False,
                                 backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d_varlen` with channels split over
    ``mesh`` (``x`` (T, D) sharded ``P(None, channel)``, states (N, D, W-1)
    ``P(None, channel, None)``, ``cu_seqlens`` replicated); no communication.
    Token (``seq_axis``) and ``batch_axis`` splits are not supported and raise
    ``NotImplementedError``."""
    ca = _varlen_axes(mesh, channel_axis, batch_axis, seq_axis, "causal_conv1d_varlen_sharded")
    V.check_backend(backend)
    act = V.check_varlen(x, weight, bias, cu_seqlens, initial_states, activation)
    _check_divides(mesh, ca, "channel_axis", x.shape[1], "channels D")
    st_spec = P(None, ca, None)
    specs = (P(None, ca), P(ca, None), P(ca), P(None), st_spec)

    def body(x, w, b, cu, init):
        return causal_conv1d_varlen(x, w, b, cu_seqlens=cu, activation=act,
                                    initial_states=init,
                                    return_final_states=return_final_states, backend=backend)

    out_specs = (P(None, ca), st_spec) if return_final_states else P(None, ca)
    return _run(mesh, body, (x, weight, bias, jnp.asarray(cu_seqlens, jnp.int32), initial_states),
                specs, out_specs)


def causal_conv1d_varlen_states_sharded(x, cu_seqlens, state_len, *, mesh, channel_axis=None,
                                        batch_axis=None, seq_axis=None, backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d_varlen_states` with channels split over
    ``mesh``: (T, D) ``P(None, channel)`` -> (N, D, state_len)
    ``P(None, channel, None)``; no communication. Channel sharding only."""
    ca = _varlen_axes(mesh, channel_axis, batch_axis, seq_axis,
                      "causal_conv1d_varlen_states_sharded")
    V.check_backend(backend)
    V.check_varlen_states(x, cu_seqlens, state_len)
    _check_divides(mesh, ca, "channel_axis", x.shape[1], "channels D")

    def body(x, cu):
        return causal_conv1d_varlen_states(x, cu, state_len, backend=backend)

    return _run(mesh, body, (x, jnp.asarray(cu_seqlens, jnp.int32)), (P(None, ca), P(None)),
                P(None, ca, None))
