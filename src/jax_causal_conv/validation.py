"""Argument checks shared by the JAX API and the PyTorch adapter.

Every misuse raises ValueError or TypeError naming the argument, what was
expected and what was received, in one wording for every framework: the
checks only read ``.shape`` and ``.dtype`` (jax and numpy arrays, torch
tensors, tracers), and dtypes are compared by name ("float32", "bfloat16",
...). What differs between frameworks is gathered in a :class:`Conventions`
value (``JAX`` here; the torch adapter defines its own). The limits come
from the compiled module, so Python and C++ agree on them.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np

from . import _jcc_cpu

MAX_WIDTH = int(_jcc_cpu.max_width)
FLOAT_NAMES = ("float32", "float16", "bfloat16", "float64")
_ACTIVATIONS = {None: None, "silu": "silu", "swish": "silu"}


class Conventions(NamedTuple):
    """What the frameworks do differently with valid arguments.

    exact_dtypes: index arrays must be int32 and states/residuals must have
        x's dtype (torch: tensors go to the kernels as they are), instead of
        any integer and any float (JAX casts them).
    host_values: the value of an index array as numpy when it is known on
        the host at no cost, else None (then its values are not checked here;
        the kernels clamp or check them).
    layout_fix: the advice appended when an argument's shape would fit the
        other layout: how to ask for it (True: channels-last, False:
        channels-first).
    """
    exact_dtypes: bool
    host_values: Callable[[object], Optional[np.ndarray]]
    layout_fix: Callable[[bool], str]


def _jax_host_values(a):
    """The value of `a` as numpy when known at trace time (not a tracer)."""
    if a is None:
        return None
    import jax  # only reached from the JAX API, which has imported it

    if isinstance(a, jax.core.Tracer):
        return None
    try:
        return np.asarray(a)
    except Exception:  # e.g. arrays spread over processes
        return None


JAX = Conventions(
    exact_dtypes=False,
    host_values=_jax_host_values,
    layout_fix=lambda to_cl: ("pass channels_last=True for (batch, seqlen, dim)" if to_cl
                              else "pass channels_last=False for (batch, dim, seqlen)"))


# --- names, shapes, dtypes ------------------------------------------------------------

# Numpy / jax dtypes and torch dtypes in caches of their own: under
# torch.compile, dynamo traces the lookup and must model every key of the
# dict it reads, and older torch (2.11) cannot hash numpy dtype keys.
_NUMPY_DTYPE_NAMES: dict = {}
_TORCH_DTYPE_NAMES: dict = {}


def dtype_name(a) -> str:
    """'float32', 'bfloat16', 'int64', ... for a numpy/jax dtype or a torch
    dtype alike; the type's name for objects without a dtype."""
    try:
        dt = a.dtype
    except AttributeError:
        return type(a).__name__
    names = _NUMPY_DTYPE_NAMES if isinstance(dt, np.dtype) else _TORCH_DTYPE_NAMES
    try:
        return names[dt]
    except KeyError:  # first sight of this dtype
        name = str(dt)
        name = name[6:] if name.startswith("torch.") else name
        names[dt] = name
        return name


def shape_of(a) -> tuple:
    s = getattr(a, "shape", None)
    if isinstance(s, tuple):  # torch.Size is one
        return s
    return tuple(s) if s is not None else tuple(np.shape(a))


def fmt(shape) -> str:
    shape = tuple(int(s) for s in shape)
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _is_int_name(name: str) -> bool:
    return name.startswith(("int", "uint"))


# --- single arguments ---------------------------------------------------------------------


class ActivationError(ValueError, NotImplementedError):
    """Unknown activation: a ValueError (this package's convention) that is
    also the NotImplementedError Dao's library raises."""


def check_activation(activation):
    """None | 'silu' (alias 'swish'); Dao's API also accepts True/False."""
    if activation is True or activation is False:
        return "silu" if activation else None
    try:
        return _ACTIVATIONS[activation]
    except (KeyError, TypeError):
        raise ActivationError(f"activation must be None, 'silu' or 'swish', got {activation!r}") from None


def check_backend(backend):
    if backend not in ("auto", "ffi", "xla"):
        raise ValueError(f"backend must be 'auto', 'ffi' or 'xla', got {backend!r}")


def check_float(name, a):
    if dtype_name(a) not in FLOAT_NAMES:
        raise TypeError(f"{name} must be float32, float16, bfloat16 or float64, "
                        f"got {dtype_name(a)}")


def check_int(name, a, exact=False):
    """An int32 index array (any integer dtype unless `exact`)."""
    got = dtype_name(a)
    if got != "int32" and (exact or not _is_int_name(got)):
        raise TypeError(f"{name} must be int32, got {got}")


def check_shape(name, a, expected, what=""):
    got = shape_of(a)
    if got != tuple(expected):
        extra = f" {what}" if what else ""
        raise ValueError(f"{name} must have shape {fmt(expected)}{extra}, got {fmt(got)}")


def check_rank(name, a, rank, layout) -> tuple:
    """Returns the shape."""
    got = shape_of(a)
    if len(got) != rank:
        raise ValueError(f"{name} must have rank {rank} {layout}, got shape {fmt(got)}")
    return got


def check_same_dtype(name, a, x, conv):
    if conv.exact_dtypes and a.dtype != x.dtype and dtype_name(a) != dtype_name(x):
        raise TypeError(f"{name} must have the dtype of x ({dtype_name(x)}), got {dtype_name(a)}")


def check_index(name, a, expected, what, conv):
    check_int(name, a, conv.exact_dtypes)
    check_shape(name, a, expected, what)


def check_states(name, a, x, batch, dim, width, channels_last, conv=JAX):
    """(batch, dim, width - 1) states, (batch, width - 1, dim) when channels-last."""
    check_float(name, a)
    check_same_dtype(name, a, x, conv)
    if channels_last:
        check_shape(name, a, (batch, width - 1, dim), "(batch, width - 1, dim)")
    else:
        check_shape(name, a, (batch, dim, width - 1), "(batch, dim, width - 1)")


def _layout_hint(name, shape, dim_axis, n, channels_last, conv) -> str:
    """Advice when the other candidate channel axis of a rank-3 argument has
    the n channels expected: it was most likely given in the other layout."""
    other = 1 if dim_axis != 1 else 2
    if len(shape) == 3 and shape[other] == n and shape[dim_axis] != n:
        return (f"; {name} {fmt(shape)} has {n} channels in the other layout: "
                f"{conv.layout_fix(not channels_last)}")
    return ""


def check_weight(weight, bias, D, conv=JAX, hint=None):
    """weight (D, W) with 1 <= W <= MAX_WIDTH, bias (D,); returns W. `hint()`
    gives advice appended to a channel-count mismatch."""
    check_float("weight", weight)
    ws = check_rank("weight", weight, 2, "(dim, width)")
    if ws[0] != D:
        raise ValueError(f"weight must have shape ({D}, width) to match x's {D} channels, "
                         f"got {fmt(ws)}{hint() if hint else ''}")
    W = ws[1]
    if not 1 <= W <= MAX_WIDTH:
        raise ValueError(f"weight width must be in [1, {MAX_WIDTH}], got width {W} "
                         f"(weight shape {fmt(ws)})")
    if bias is not None:
        check_float("bias", bias)
        check_shape("bias", bias, (D,), "(dim,)")
    return W


# --- whole calls ----------------------------------------------------------------------------


def check_conv(x, weight, bias, residual, seq_idx, initial_states, channels_last, activation,
               conv=JAX):
    """causal_conv1d's arguments; returns the activation (None or 'silu')."""
    activation = check_activation(activation)
    check_float("x", x)
    xs = check_rank("x", x, 3, "(batch, seqlen, dim)" if channels_last else "(batch, dim, seqlen)")
    B = xs[0]
    D, L = (xs[2], xs[1]) if channels_last else (xs[1], xs[2])
    dim_axis = 2 if channels_last else 1
    W = check_weight(weight, bias, D, conv,
                     lambda: _layout_hint("x", xs, dim_axis, shape_of(weight)[0], channels_last, conv))
    if residual is not None:
        check_float("residual", residual)
        check_same_dtype("residual", residual, x, conv)
        check_shape("residual", residual, xs, "(the shape of x)")
    if seq_idx is not None:  # ids are free-form (an equality mask): no value checks
        check_index("seq_idx", seq_idx, (B, L), "(batch, seqlen)", conv)
    if initial_states is not None:
        check_states("initial_states", initial_states, x, B, D, W, channels_last, conv)
    return activation


def check_cu_seqlens(cu_seqlens, T, conv=JAX):
    """(N+1,) integer offsets from 0 to T, non-decreasing (values checked when
    known on the host); returns N."""
    check_int("cu_seqlens", cu_seqlens)
    cs = shape_of(cu_seqlens)
    if len(cs) != 1 or cs[0] < 1:
        raise ValueError(f"cu_seqlens must have shape (N+1,), got {fmt(cs)}")
    v = conv.host_values(cu_seqlens)
    if v is not None:
        if v[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0, got {v[0]}")
        if np.any(np.diff(v.astype(np.int64)) < 0):
            raise ValueError("cu_seqlens must be non-decreasing")
        if v[-1] != T:
            raise ValueError(f"cu_seqlens must end at the total length {T}, got {v[-1]}")
    return cs[0] - 1


def check_varlen(x, weight, bias, cu_seqlens, initial_states, activation, conv=JAX):
    """causal_conv1d_varlen's arguments; returns the activation."""
    activation = check_activation(activation)
    check_float("x", x)
    T, D = check_rank("x", x, 2, "(total_tokens, dim)")
    W = check_weight(weight, bias, D, conv)
    N = check_cu_seqlens(cu_seqlens, T, conv)
    if initial_states is not None:
        check_float("initial_states", initial_states)
        check_same_dtype("initial_states", initial_states, x, conv)
        check_shape("initial_states", initial_states, (N, D, W - 1), "(num_seqs, dim, width - 1)")
    return activation


def check_channels_last(channels_last):
    # a static layout switch: a traced or non-bool value is a mistake
    if not isinstance(channels_last, (bool, np.bool_)):
        raise TypeError(f"channels_last must be a Python bool, got {channels_last!r}")


def check_varlen_states(x, cu_seqlens, state_len, channels_last=False, conv=JAX):
    """causal_conv1d_varlen_states' arguments; returns the output shape,
    (N, D, state_len), or (N, state_len, D) when channels-last."""
    check_channels_last(channels_last)
    check_float("x", x)
    T, D = check_rank("x", x, 2, "(total_tokens, dim)")
    N = check_cu_seqlens(cu_seqlens, T, conv)
    if isinstance(state_len, bool) or not isinstance(state_len, (int, np.integer)) or state_len < 0:
        raise ValueError(f"state_len must be a non-negative int, got {state_len!r}")
    return (N, int(state_len), D) if channels_last else (N, D, int(state_len))


def check_update(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, activation,
                 channels_last=False, conv=JAX):
    """causal_conv1d_update's arguments; returns the activation.

    x (B, D) or (B, D, S) and conv_state (num_slots, D, state_len); with
    channels_last, x (B, D) or (B, S, D) and conv_state (num_slots, state_len, D).
    """
    check_channels_last(channels_last)
    activation = check_activation(activation)
    check_float("x", x)
    xs = shape_of(x)
    if len(xs) not in (2, 3):
        layout = "(batch, seqlen, dim)" if channels_last else "(batch, dim, seqlen)"
        raise ValueError(f"x must have rank 2 (batch, dim) or 3 {layout}, got shape {fmt(xs)}")
    dim_axis = 2 if channels_last and len(xs) == 3 else 1
    B, D = xs[0], xs[dim_axis]
    W = check_weight(weight, bias, D, conv,
                     lambda: _layout_hint("x", xs, dim_axis, shape_of(weight)[0], channels_last, conv))
    check_float("conv_state", conv_state)
    check_same_dtype("conv_state", conv_state, x, conv)
    layout = "(num_slots, state_len, dim)" if channels_last else "(num_slots, dim, state_len)"
    ss = check_rank("conv_state", conv_state, 3, layout)
    N, SL, Ds = (ss[0], ss[1], ss[2]) if channels_last else (ss[0], ss[2], ss[1])
    if Ds != D:
        want = f"(num_slots, state_len, {D})" if channels_last else f"(num_slots, {D}, state_len)"
        hint = _layout_hint("conv_state", ss, 2 if channels_last else 1, D, channels_last, conv)
        raise ValueError(f"conv_state must have shape {layout} = {want} to match x's {D} "
                         f"channels, got {fmt(ss)}{hint}")
    if SL < W - 1:
        raise ValueError(f"conv_state's state_len must be >= width - 1 = {W - 1}, "
                         f"got state_len {SL} (shape {fmt(ss)})")
    if cache_seqlens is not None:
        check_index("cache_seqlens", cache_seqlens, (B,), "(batch,)", conv)
    if conv_state_indices is not None:
        check_index("conv_state_indices", conv_state_indices, (B,), "(batch,)", conv)
        v = conv.host_values(conv_state_indices)
        if v is not None:
            bad = np.flatnonzero((v < -1) | (v >= N))
            if bad.size:
                i = int(bad[0])
                raise ValueError(f"conv_state_indices[{i}] = {v[i]} is outside [-1, {N}) "
                                 f"(num_slots = {N})")
    elif N < B:
        raise ValueError(f"conv_state has {N} slots for batch {B}: pass conv_state_indices "
                         "or one slot per row")
    return activation
