"""Pinned layouts: the public functions with their arrays placed on a mesh as named.

The public functions partition themselves under ``jit`` (docs/sharding.md):
place the inputs with a ``NamedSharding`` and every call follows, like XLA's
own ops. These wrappers are for the exception, a layout that should not be
left to sharding propagation: they constrain every array to the split named
by ``batch_axis``, ``channel_axis`` and ``seq_axis`` (a mesh axis, a tuple of
axes, or ``None``), call the public function, and constrain its outputs the
same way. Under an Auto mesh that is ``with_sharding_constraint``; under an
Explicit one, ``jax.sharding.reshard``. Communication is that of the
automatic split: none for batch and channel splits, a W-1 halo for a
sequence split.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from . import validation as V
from ._lowering.partitioning import ShardingFallbackWarning
from .conv import causal_conv1d, causal_conv1d_varlen
from .decode import causal_conv1d_update, causal_conv1d_varlen_states

__all__ = [
    "ShardingFallbackWarning",
    "causal_conv1d_sharded",
    "causal_conv1d_update_sharded",
    "causal_conv1d_varlen_sharded",
    "causal_conv1d_varlen_states_sharded",
]


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


def _check_axes(**axes):
    seen = {}
    for arg, axis in axes.items():
        for n in _axis_names(axis):
            if n in seen:
                raise ValueError(f"mesh axis {n!r} is used by both {seen[n]} and {arg}")
            seen[n] = arg


def _check_divides(mesh, axis, arg, size, what):
    n = math.prod(mesh.shape[a] for a in _axis_names(axis))
    if axis is not None and size % n:
        raise ValueError(f"{arg}={axis!r} splits {what} over {n} devices, but {what} = {size} "
                         f"is not divisible by {n}")


def _place(mesh, tree, specs):
    """Every array of ``tree`` constrained to its spec (a no-op where it is so)."""
    explicit = getattr(getattr(jax.sharding, "AxisType", None), "Explicit", None)
    pin = (jax.sharding.reshard if explicit is not None and explicit in
           tuple(getattr(mesh, "axis_types", ())) else jax.lax.with_sharding_constraint)
    return jax.tree.map(lambda a, s: None if a is None else pin(a, NamedSharding(mesh, s)),
                        tree, specs, is_leaf=lambda a: a is None)


def causal_conv1d_sharded(x, weight, bias=None, *, mesh, batch_axis=None, channel_axis=None,
                          seq_axis=None, activation=None, residual=None, seq_idx=None,
                          initial_states=None, return_final_states=False, channels_last=False,
                          backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d` with ``x`` split over ``mesh`` as named.

    ``x``, ``residual`` and ``y`` are placed ``P(batch, channel, seq)``
    (``P(batch, seq, channel)`` with ``channels_last``); ``weight``
    ``P(channel, None)``; ``bias`` ``P(channel)``; ``seq_idx`` ``P(batch, seq)``;
    ``initial_states`` and ``final_states`` ``P(batch, channel, None)``
    (``P(batch, None, channel)``). Every other argument is that of
    ``causal_conv1d``.
    """
    V.check_backend(backend)
    V.check_conv(x, weight, bias, residual, seq_idx, initial_states, channels_last, activation)
    ba = _norm_axis(mesh, batch_axis, "batch_axis")
    ca = _norm_axis(mesh, channel_axis, "channel_axis")
    sa = _norm_axis(mesh, seq_axis, "seq_axis")
    _check_axes(batch_axis=ba, channel_axis=ca, seq_axis=sa)
    cl = bool(channels_last)
    B, L, D = (x.shape if cl else (x.shape[0], x.shape[2], x.shape[1]))
    _check_divides(mesh, ba, "batch_axis", B, "batch B")
    _check_divides(mesh, ca, "channel_axis", D, "channels D")
    _check_divides(mesh, sa, "seq_axis", L, "length L")
    xs = P(ba, sa, ca) if cl else P(ba, ca, sa)
    sts = P(ba, None, ca) if cl else P(ba, ca, None)
    x, weight, bias, residual, seq_idx, initial_states = _place(
        mesh, (x, weight, bias, residual, seq_idx, initial_states),
        (xs, P(ca, None), P(ca), xs, P(ba, sa), sts))
    out = causal_conv1d(x, weight, bias, activation=activation, residual=residual,
                        seq_idx=seq_idx, initial_states=initial_states,
                        return_final_states=return_final_states, channels_last=cl,
                        backend=backend)
    return _place(mesh, out, (xs, sts) if return_final_states else xs)


def causal_conv1d_update_sharded(x, conv_state, weight, bias=None, *, mesh, batch_axis=None,
                                 channel_axis=None, activation=None, cache_seqlens=None,
                                 conv_state_indices=None, backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d_update` with rows, state slots and/or
    channels split over ``mesh``; runs locally, no communication.

    ``x`` is placed ``P(batch, channel[, None])``, ``conv_state``
    ``P(batch, channel, None)`` (the slot pool is cut into contiguous blocks,
    one per batch shard), ``weight`` ``P(channel, None)``, ``bias``
    ``P(channel)``, ``cache_seqlens`` and ``conv_state_indices`` ``P(batch)``.

    ``conv_state_indices`` hold global slot numbers; a row on batch shard ``k``
    must use a slot of block ``k`` (slots ``k*N/n`` to ``(k+1)*N/n - 1``). A row
    pointing at another shard's block is treated as a padding row (zero output,
    no state touched): the slot pool is not communicated. Without
    ``conv_state_indices`` and with batch sharding the pool must have exactly
    one slot per row (N == B).
    """
    V.check_backend(backend)
    V.check_update(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, activation)
    ba = _norm_axis(mesh, batch_axis, "batch_axis")
    ca = _norm_axis(mesh, channel_axis, "channel_axis")
    _check_axes(batch_axis=ba, channel_axis=ca)
    B, D = x.shape[:2]
    N = conv_state.shape[0]
    _check_divides(mesh, ba, "batch_axis", B, "batch B")
    _check_divides(mesh, ba, "batch_axis", N, "the number of state slots")
    _check_divides(mesh, ca, "channel_axis", D, "channels D")
    if ba is not None and conv_state_indices is None and N != B:
        raise ValueError(f"batch_axis={batch_axis!r} without conv_state_indices needs one state "
                         f"slot per row (num_slots == batch), got {N} slots for batch {B}: pass "
                         "conv_state_indices")
    xs = P(ba, ca) if x.ndim == 2 else P(ba, ca, None)
    sts = P(ba, ca, None)
    args = _place(mesh, (x, conv_state, weight, bias, cache_seqlens, conv_state_indices),
                  (xs, sts, P(ca, None), P(ca), P(ba), P(ba)))
    out = causal_conv1d_update(*args[:4], activation=activation, cache_seqlens=args[4],
                               conv_state_indices=args[5], backend=backend)
    return _place(mesh, out, (xs, sts))


def _varlen_axes(mesh, channel_axis, batch_axis, seq_axis, what):
    if batch_axis is not None:
        raise ValueError(f"{what}: packed sequences have no batch dimension to split "
                         f"(batch_axis={batch_axis!r}); split the tokens (seq_axis) or the "
                         "channels (channel_axis)")
    ca = _norm_axis(mesh, channel_axis, "channel_axis")
    sa = _norm_axis(mesh, seq_axis, "seq_axis")
    _check_axes(channel_axis=ca, seq_axis=sa)
    return ca, sa


def causal_conv1d_varlen_sharded(x, weight, bias=None, *, cu_seqlens, mesh, channel_axis=None,
                                 batch_axis=None, seq_axis=None, activation=None,
                                 initial_states=None, return_final_states=False,
                                 backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d_varlen` with the tokens (``seq_axis``)
    and/or channels split over ``mesh``: ``x`` (T, D) placed ``P(seq, channel)``,
    states (N, D, W-1) ``P(None, channel, None)``, ``cu_seqlens`` replicated."""
    ca, sa = _varlen_axes(mesh, channel_axis, batch_axis, seq_axis,
                          "causal_conv1d_varlen_sharded")
    V.check_backend(backend)
    V.check_varlen(x, weight, bias, cu_seqlens, initial_states, activation)
    _check_divides(mesh, ca, "channel_axis", x.shape[1], "channels D")
    _check_divides(mesh, sa, "seq_axis", x.shape[0], "tokens T")
    sts = P(None, ca, None)
    x, weight, bias, cu, initial_states = _place(
        mesh, (x, weight, bias, jnp.asarray(cu_seqlens, jnp.int32), initial_states),
        (P(sa, ca), P(ca, None), P(ca), P(None), sts))
    out = causal_conv1d_varlen(x, weight, bias, cu_seqlens=cu, activation=activation,
                               initial_states=initial_states,
                               return_final_states=return_final_states, backend=backend)
    return _place(mesh, out, (P(sa, ca), sts) if return_final_states else P(sa, ca))


def causal_conv1d_varlen_states_sharded(x, cu_seqlens, state_len, *, mesh, channel_axis=None,
                                        batch_axis=None, seq_axis=None, backend="auto"):
    """:func:`jax_causal_conv.causal_conv1d_varlen_states` with the tokens and/or
    channels split over ``mesh``: (T, D) ``P(seq, channel)`` -> (N, D, state_len)
    ``P(None, channel, None)``."""
    ca, sa = _varlen_axes(mesh, channel_axis, batch_axis, seq_axis,
                          "causal_conv1d_varlen_states_sharded")
    V.check_backend(backend)
    V.check_varlen_states(x, cu_seqlens, state_len)
    _check_divides(mesh, ca, "channel_axis", x.shape[1], "channels D")
    _check_divides(mesh, sa, "seq_axis", x.shape[0], "tokens T")
    x, cu = _place(mesh, (x, jnp.asarray(cu_seqlens, jnp.int32)), (P(sa, ca), P(None)))
    out = causal_conv1d_varlen_states(x, cu, state_len, backend=backend)
    return _place(mesh, out, P(None, ca, None))
