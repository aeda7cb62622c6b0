"""Trace-time argument checks. Every misuse raises ValueError or TypeError
naming the argument, what was expected and what was received."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ._lowering.targets import MAX_WIDTH

FLOAT_DTYPES = (jnp.float32, jnp.float16, jnp.bfloat16, jnp.float64)
_ACTIVATIONS = {None: None, "silu": "silu", "swish": "silu"}


def _dtype_name(a):
    return str(getattr(a, "dtype", type(a).__name__))


def _shape(a):
    return tuple(np.shape(a))


def _fmt(shape):
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_float(name, a):
    dt = getattr(a, "dtype", None)
    if dt is None or not any(jnp.dtype(dt) == jnp.dtype(f) for f in FLOAT_DTYPES):
        raise TypeError(f"{name} must be a float32, float16, bfloat16 or float64 array, "
                        f"got dtype {_dtype_name(a)}")


def check_int(name, a):
    dt = getattr(a, "dtype", None)
    if dt is None or not jnp.issubdtype(dt, jnp.integer):
        raise TypeError(f"{name} must be an int32 array, got dtype {_dtype_name(a)}")


def check_shape(name, a, expected, what=""):
    got = _shape(a)
    if got != tuple(expected):
        extra = f" {what}" if what else ""
        raise ValueError(f"{name} must have shape {_fmt(expected)}{extra}, got {_fmt(got)}")


def check_rank(name, a, rank, layout):
    if np.ndim(a) != rank:
        raise ValueError(f"{name} must have rank {rank} {layout}, got shape {_fmt(_shape(a))}")


def check_activation(activation):
    if isinstance(activation, bool):  # Dao's API accepts activation=True for silu
        return "silu" if activation else None
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be None, 'silu' or 'swish', got {activation!r}")
    return _ACTIVATIONS[activation]


def check_backend(backend):
    if backend not in ("auto", "ffi", "xla"):
        raise ValueError(f"backend must be 'auto', 'ffi' or 'xla', got {backend!r}")


def concrete(a):
    """The value of `a` as numpy when known at trace time, else None."""
    if a is None or isinstance(a, jax.core.Tracer):
        return None
    try:
        return np.asarray(a)
    except Exception:  # e.g. arrays spread over processes
        return None


def check_weight(weight, bias, D):
    check_float("weight", weight)
    check_rank("weight", weight, 2, "(dim, width)")
    W = _shape(weight)[1]
    if _shape(weight)[0] != D:
        raise ValueError(f"weight must have shape ({D}, width) to match x's {D} channels, "
                         f"got {_fmt(_shape(weight))}")
    if not 1 <= W <= MAX_WIDTH:
        raise ValueError(f"weight width must be in [1, {MAX_WIDTH}], got width {W} "
                         f"(weight shape {_fmt(_shape(weight))})")
    if bias is not None:
        check_float("bias", bias)
        check_shape("bias", bias, (D,))
    return W


def check_conv(x, weight, bias, residual, seq_idx, initial_states, channels_last, activation):
    activation = check_activation(activation)
    check_float("x", x)
    layout = "(batch, seqlen, dim)" if channels_last else "(batch, dim, seqlen)"
    check_rank("x", x, 3, layout)
    B, a1, a2 = _shape(x)
    D, L = (a2, a1) if channels_last else (a1, a2)
    W = check_weight(weight, bias, D)
    if residual is not None:
        check_float("residual", residual)
        check_shape("residual", residual, _shape(x), "(the shape of x)")
    if seq_idx is not None:
        check_int("seq_idx", seq_idx)
        check_shape("seq_idx", seq_idx, (B, L), "(batch, seqlen)")
    if initial_states is not None:
        check_float("initial_states", initial_states)
        want = (B, W - 1, D) if channels_last else (B, D, W - 1)
        check_shape("initial_states", initial_states, want,
                    "(batch, width-1, dim)" if channels_last else "(batch, dim, width-1)")
    return activation


def check_cu_seqlens(cu_seqlens, T):
    check_int("cu_seqlens", cu_seqlens)
    if np.ndim(cu_seqlens) != 1 or _shape(cu_seqlens)[0] < 1:
        raise ValueError(f"cu_seqlens must have shape (N+1,), got {_fmt(_shape(cu_seqlens))}")
    v = concrete(cu_seqlens)
    if v is not None:
        if v[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0] = {v[0]}")
        if np.any(np.diff(v.astype(np.int64)) < 0):
            raise ValueError("cu_seqlens must be non-decreasing")
        if v[-1] != T:
            raise ValueError(f"cu_seqlens must end at the total length T = {T}, "
                             f"got cu_seqlens[-1] = {v[-1]}")
    return _shape(cu_seqlens)[0] - 1


def check_varlen(x, weight, bias, cu_seqlens, initial_states, activation):
    activation = check_activation(activation)
    check_float("x", x)
    check_rank("x", x, 2, "(total_tokens, dim)")
    T, D = _shape(x)
    W = check_weight(weight, bias, D)
    N = check_cu_seqlens(cu_seqlens, T)
    if initial_states is not None:
        check_float("initial_states", initial_states)
        check_shape("initial_states", initial_states, (N, D, W - 1), "(num_seqs, dim, width-1)")
    return activation


def check_varlen_states(x, cu_seqlens, state_len):
    check_float("x", x)
    check_rank("x", x, 2, "(total_tokens, dim)")
    check_cu_seqlens(cu_seqlens, _shape(x)[0])
    if not isinstance(state_len, (int, np.integer)) or state_len < 0:
        raise ValueError(f"state_len must be a non-negative int, got {state_len!r}")


def check_update(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, activation):
    activation = check_activation(activation)
    check_float("x", x)
    if np.ndim(x) not in (2, 3):
        raise ValueError("x must have rank 2 (batch, dim) or 3 (batch, dim, seqlen), "
                         f"got shape {_fmt(_shape(x))}")
    B, D = _shape(x)[:2]
    W = check_weight(weight, bias, D)
    check_float("conv_state", conv_state)
    check_rank("conv_state", conv_state, 3, "(num_slots, dim, state_len)")
    N, Ds, SL = _shape(conv_state)
    if Ds != D:
        raise ValueError(f"conv_state must have shape (num_slots, {D}, state_len), "
                         f"got {_fmt(_shape(conv_state))}")
    if SL < W - 1:
        raise ValueError(f"conv_state's state_len must be >= width - 1 = {W - 1}, "
                         f"got state_len {SL} (shape {_fmt(_shape(conv_state))})")
    if cache_seqlens is not None:
        check_int("cache_seqlens", cache_seqlens)
        check_shape("cache_seqlens", cache_seqlens, (B,), "(batch,)")
    if conv_state_indices is not None:
        check_int("conv_state_indices", conv_state_indices)
        check_shape("conv_state_indices", conv_state_indices, (B,), "(batch,)")
        v = concrete(conv_state_indices)
        if v is not None and v.size and (v.min() < -1 or v.max() >= N):
            raise ValueError(f"conv_state_indices must be in [-1, {N}) (num_slots = {N}), "
                             f"got values in [{v.min()}, {v.max()}]")
    elif N < B:
        raise ValueError(f"conv_state has {N} slots for batch {B}: pass conv_state_indices "
                         "or one slot per row")
    return activation
