"""One function per FFI target, in the kernels' own argument convention.

Each is a ``custom_vmap`` whose rule folds the mapped axis into the kernel's
batch (and a mapped weight into weight groups), so any nesting of ``vmap`` is
still ONE custom call. Each also has a pure-XLA twin, selected by
``lax.platform_dependent`` on platforms without our kernels (TPU, ROCm).

Kernel convention (csrc/problem.h): x is 3-D (B, D, L) or (B, L, D); weight is
(G, D, W) and bias (G, D), row b using group b // (B // G); varlen x is
(B, T, D) with cu_seqlens (B, N+1) and states (B*N, D, W-1). Absent optional
arrays are None here and zero-size placeholders at the FFI boundary.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap

from . import _ffi, reference

ROWS, SEQ_IDX, VARLEN = 0, 1, 2  # SegmentMode


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    activation: str | None
    mode: int
    channels_last: bool
    states_channels_last: bool
    want_final: bool
    backend: str  # "auto" or "ffi"


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    activation: str | None
    backend: str


# --- folding helpers --------------------------------------------------------

def _bcast(a, n, batched):
    return a if a is None or batched else jnp.broadcast_to(a, (n,) + a.shape)


# (explicit sizes, not -1: arrays may have zero-size axes, e.g. W-1 = 0)
def _fold(a):
    return None if a is None else a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])


def _unfold(a, n):
    return None if a is None else a.reshape((n, a.shape[0] // n) + a.shape[1:])


def _fold_all(n, args, batched):
    return [_fold(_bcast(a, n, bt)) for a, bt in zip(args, batched)]


def _placeholder(dtype):
    return jnp.zeros((0,), dtype)


def _attrs_conv(cfg):
    return dict(activation=np.int64(cfg.activation == "silu"), mode=np.int64(cfg.mode),
                channels_last=np.bool_(cfg.channels_last),
                states_channels_last=np.bool_(cfg.states_channels_last))


def _state_shape(cfg, x, w, cu):
    B, D = x.shape[0], (x.shape[2] if cfg.channels_last else x.shape[1])
    rows = B * (cu.shape[1] - 1) if cfg.mode == VARLEN else B
    H = w.shape[-1] - 1
    return (rows, H, D) if cfg.states_channels_last else (rows, D, H)


def _vma(a):
    """The shard_map mesh axes ``a`` varies over (empty outside shard_map)."""
    if a is None:
        return frozenset()
    t = jax.typeof(a)
    v = getattr(t, "vma", None)  # older jax spelling
    if v is None:
        v = getattr(getattr(t, "mat", None), "varying", ())
    return frozenset(v)


def _union_vma(args):
    return frozenset().union(*(_vma(a) for a in jax.tree.leaves(args)))


def _to_varying(tree, vma):
    """Type-level cast (no runtime op) of every leaf to vary over ``vma``."""
    def cast(o):
        rest = tuple(sorted(vma - _vma(o)))
        if not rest:
            return o
        return lax.pcast(o, rest, to="varying") if hasattr(lax, "pcast") else lax.pvary(o, rest)
    return jax.tree.map(cast, tree) if vma else tree


def _dispatch(backend, ffi_fn, xla_fn, dtype, *args):
    """The FFI kernel where one exists for the platform, else the XLA twin.

    Under shard_map, ffi_call types its results from the ShapeDtypeStructs, as
    device-invariant; they are cast to vary over the inputs' mesh axes (as the
    XLA twin's do), so the branches match and transposes stay correct."""
    vma = _union_vma(args)
    if vma:
        ffi_raw = ffi_fn
        ffi_fn = lambda *a: _to_varying(ffi_raw(*a), vma)  # noqa: E731
    if backend == "ffi":
        return ffi_fn(*args)
    kernels = {p: ffi_fn for p in _ffi.PLATFORMS if not (p == "cuda" and dtype == jnp.float64)}
    return lax.platform_dependent(*args, default=xla_fn, **kernels)


# --- forward ------------------------------------------------------------------

def _ffi_forward(cfg, x, w, b, res, seq_idx, cu, init):
    fin_shape = _state_shape(cfg, x, w, cu) if cfg.want_final else (0,)
    call = jax.ffi.ffi_call(_ffi.FORWARD, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                           jax.ShapeDtypeStruct(fin_shape, x.dtype)))
    ph, ph_i = _placeholder(x.dtype), _placeholder(jnp.int32)
    y, fin = call(x, w, ph if b is None else b, ph if res is None else res,
                  ph_i if seq_idx is None else seq_idx, ph_i if cu is None else cu,
                  ph if init is None else init, **_attrs_conv(cfg),
                  has_bias=np.bool_(b is not None), has_residual=np.bool_(res is not None),
                  has_initial_states=np.bool_(init is not None),
                  has_final_states=np.bool_(cfg.want_final))
    return y, (fin if cfg.want_final else None)


def _split_groups(a, G):
    return None if a is None else a.reshape((G, a.shape[0] // G) + a.shape[1:])


def _xla_forward(cfg, x, w, b, res, seq_idx, cu, init):
    G = w.shape[0]
    if cfg.mode == VARLEN:
        N = cu.shape[1] - 1
        init_rows = None if init is None else init.reshape((x.shape[0], N) + init.shape[1:])

        def row(xr, wg, bg, cur, ir):
            return reference.causal_conv1d_varlen(
                xr, wg, bg, cu_seqlens=cur, activation=cfg.activation, initial_states=ir,
                return_final_states=True)
        per_group = jax.vmap(row, in_axes=(0, None, None, 0, 0))
        y, fin = jax.vmap(per_group)(_split_groups(x, G), w, b, _split_groups(cu, G),
                                     _split_groups(init_rows, G))
        fin = fin.reshape((fin.shape[0] * fin.shape[1] * fin.shape[2],) + fin.shape[3:])
    else:
        def group(xg, wg, bg, rg, sg, ig):
            return reference.causal_conv1d(
                xg, wg, bg, activation=cfg.activation, residual=rg, seq_idx=sg,
                initial_states=ig, return_final_states=True, channels_last=cfg.channels_last)
        y, fin = jax.vmap(group)(*[_split_groups(a, G) for a in (x,)], w, b,
                                 *[_split_groups(a, G) for a in (res, seq_idx, init)])
        fin = _fold(fin)
    return y.reshape(x.shape), (fin if cfg.want_final else None)


@functools.lru_cache(maxsize=None)
def _forward_fn(cfg):
    def run(x, w, b, res, seq_idx, cu, init):
        return _dispatch(cfg.backend, functools.partial(_ffi_forward, cfg),
                         functools.partial(_xla_forward, cfg), x.dtype,
                         x, w, b, res, seq_idx, cu, init)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, w, b, res, seq_idx, cu, init):
        xb, wb, bb, rb, sb, cb, ib = in_batched
        if wb or bb or w.shape[0] > 1:  # weights differ per mapped item: fold into groups
            w, b = _fold_all(n, (w, b), (wb, bb))
        x, res, seq_idx, cu, init = _fold_all(n, (x, res, seq_idx, cu, init), (xb, rb, sb, cb, ib))
        y, fin = f(x, w, b, res, seq_idx, cu, init)
        return (_unfold(y, n), _unfold(fin, n)), (True, None if fin is None else True)

    return f


def forward(cfg, x, w, b, res, seq_idx, cu, init):
    """-> (y, final_states or None)"""
    return _forward_fn(cfg)(x, w, b, res, seq_idx, cu, init)


# --- backward -----------------------------------------------------------------

def _ffi_backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    B, L, D = x.shape if cfg.channels_last else (x.shape[0], x.shape[2], x.shape[1])
    # Scratch for the CUDA kernel's partial sums, allocated by XLA (the CPU
    # kernel ignores it): the kernels themselves allocate nothing.
    ws = jax.ShapeDtypeStruct((_ffi.backward_workspace_bytes(B, D, L, w.shape[-1]),), jnp.uint8)
    outs = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(w.shape, w.dtype),
            jax.ShapeDtypeStruct((0,), x.dtype) if b is None else jax.ShapeDtypeStruct(b.shape, b.dtype),
            jax.ShapeDtypeStruct((0,), x.dtype) if init is None else jax.ShapeDtypeStruct(init.shape, x.dtype),
            ws)
    ph, ph_i = _placeholder(x.dtype), _placeholder(jnp.int32)
    dx, dw, db, dinit, _ = jax.ffi.ffi_call(_ffi.BACKWARD, outs)(
        x, w, ph if b is None else b, ph_i if seq_idx is None else seq_idx,
        ph_i if cu is None else cu, ph if init is None else init, dy,
        ph if dfin is None else dfin, **_attrs_conv(cfg),
        has_bias=np.bool_(b is not None), has_initial_states=np.bool_(init is not None),
        has_dfinal_states=np.bool_(dfin is not None))
    return dx, dw, (None if b is None else db), (None if init is None else dinit)


def _xla_backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    cfg = dataclasses.replace(cfg, want_final=dfin is not None)
    # per-shard partial gradients, like the kernel's (backward() sums them)
    x, w, b, init = _to_varying((x, w, b, init), _union_vma((x, w, b, seq_idx, cu, init, dy, dfin)))
    _, vjp = jax.vjp(lambda x, w, b, init: _xla_forward(cfg, x, w, b, None, seq_idx, cu, init),
                     x, w, b, init)
    return vjp((dy, dfin))


@functools.lru_cache(maxsize=None)
def _backward_fn(cfg):
    def run(x, w, b, seq_idx, cu, init, dy, dfin):
        return _dispatch(cfg.backend, functools.partial(_ffi_backward, cfg),
                         functools.partial(_xla_backward, cfg), x.dtype,
                         x, w, b, seq_idx, cu, init, dy, dfin)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, w, b, seq_idx, cu, init, dy, dfin):
        # Gradients are per mapped item, so weights and states always get the
        # mapped axis (weights are small; JAX sums unmapped ones afterwards).
        args = _fold_all(n, (x, w, b, seq_idx, cu, init, dy, dfin), in_batched)
        outs = f(*args)
        return tuple(_unfold(o, n) for o in outs), tuple(None if o is None else True for o in outs)

    return f


def backward(cfg, x, w, b, seq_idx, cu, init, dy, dfin):
    """-> (dx, dweight, dbias or None, dinitial_states or None)"""
    grads = _backward_fn(cfg)(x, w, b, seq_idx, cu, init, dy, dfin)
    # Under shard_map: an input replicated over mesh axes the computation varies
    # over (weights under batch/sequence sharding) gets its per-shard partial
    # gradients summed over those axes.
    vma = _union_vma((x, w, b, seq_idx, cu, init, dy, dfin))
    return tuple(g if g is None or not (vma - _vma(p)) else
                 lax.psum(g, tuple(sorted(vma - _vma(p))))
                 for g, p in zip(grads, (x, w, b, init)))


# --- decode update ------------------------------------------------------------

# Inside a lax.scan over tokens, XLA folds the slice of xs and the write into
# ys into the update's custom call (a dynamic-slice fusion, the kernel
# addressing the stacked arrays). That keeps the loop body out of XLA's
# command buffers, so every step launches our kernel from the host: on an
# H100 (B=64, D=4096 bf16, 256 steps) ours added 3.2-4.1 us per step over an
# empty body with the fusion, 0.4-1.8 us without it. Larger steps make the
# loop device-bound, and there the fusion's saved copies win (B=256, D=8192:
# 4.2 against 11.1 us per step), so only steps up to this many bytes of x
# get an optimization barrier on x and on y, which keeps XLA from forming
# the fusion (on one side only it was worse than either) and costs nothing
# outside loops.
_NO_SLICE_FUSION_MAX_BYTES = 1 << 20


def _ffi_update(cfg, x, state, w, b, cache, idx):
    unfused = x.size * x.dtype.itemsize <= _NO_SLICE_FUSION_MAX_BYTES
    if unfused:
        x = lax.optimization_barrier(x)
    ph, ph_i = _placeholder(x.dtype), _placeholder(jnp.int32)
    call = jax.ffi.ffi_call(
        _ffi.UPDATE, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                      jax.ShapeDtypeStruct(state.shape, state.dtype)),
        input_output_aliases={1: 1})
    y, s = call(x, state, w, ph if b is None else b, ph_i if cache is None else cache,
                ph_i if idx is None else idx, activation=np.int64(cfg.activation == "silu"),
                has_bias=np.bool_(b is not None), has_cache_seqlens=np.bool_(cache is not None),
                has_state_indices=np.bool_(idx is not None))
    if unfused:
        y = lax.optimization_barrier(y)
    return y, s


def _xla_update(cfg, x, state, w, b, cache, idx):
    G = w.shape[0]
    if G == 1:
        return reference.causal_conv1d_update(
            x, state, w[0], None if b is None else b[0], activation=cfg.activation,
            cache_seqlens=cache, conv_state_indices=idx)
    # Weight groups only arise from vmap, where each group owns its own rows
    # and slots (the rule below lays them out contiguously).
    N = state.shape[0] // G
    local = None if idx is None else jnp.where(idx >= 0, idx % max(N, 1), -1)
    xg, sg, cg, ig = (_split_groups(a, G) for a in (x, state, cache, local))
    ys, states = jax.vmap(lambda xg, sg, wg, bg, cg, ig: reference.causal_conv1d_update(
        xg, sg, wg, bg, activation=cfg.activation, cache_seqlens=cg, conv_state_indices=ig))(
        xg, sg, w, b, cg, ig)
    return ys.reshape(x.shape), states.reshape(state.shape)


@functools.lru_cache(maxsize=None)
def _update_fn(cfg):
    def run(x, state, w, b, cache, idx):
        return _dispatch(cfg.backend, functools.partial(_ffi_update, cfg),
                         functools.partial(_xla_update, cfg), x.dtype,
                         x, state, w, b, cache, idx)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, state, w, b, cache, idx):
        xb, sb, wb, bb, cb, ib = in_batched
        B, N = x.shape[1] if xb else x.shape[0], state.shape[1] if sb else state.shape[0]
        if idx is None:
            idx, ib = jnp.arange(B, dtype=jnp.int32), False
        # Each mapped item owns its own block of N slots in the folded state.
        idx = _bcast(idx, n, ib)
        offset = (jnp.arange(n, dtype=jnp.int32) * N)[:, None]
        idx = jnp.where((idx >= 0) & (idx < N), idx + offset, -1)
        if wb or bb or w.shape[0] > 1:
            w, b = _fold_all(n, (w, b), (wb, bb))
        x, state, cache = _fold_all(n, (x, state, cache), (xb, sb, cb))
        y, new_state = f(x, state, w, b, cache, _fold(idx))
        return (_unfold(y, n), _unfold(new_state, n)), (True, True)

    return f


def update(cfg, x, state, w, b, cache, idx):
    """x (B, D, S), state (N, D, SL) -> (y, new_state)"""
    return _update_fn(cfg)(x, state, w, b, cache, idx)


# --- varlen states ------------------------------------------------------------

def _ffi_varlen_states(state_len, x, cu):
    out = jax.ShapeDtypeStruct((cu.shape[0] - 1, x.shape[1], state_len), x.dtype)
    return jax.ffi.ffi_call(_ffi.VARLEN_STATES, out)(x, cu)


def _xla_varlen_states(state_len, x, cu):
    return reference.varlen_final_states(x, cu, None, state_len)


@functools.lru_cache(maxsize=None)
def _varlen_states_fn(state_len, backend):
    def run(x, cu):
        return _dispatch(backend, functools.partial(_ffi_varlen_states, state_len),
                         functools.partial(_xla_varlen_states, state_len), x.dtype, x, cu)

    f = custom_vmap(run)

    @f.def_vmap
    def rule(n, in_batched, x, cu):
        xb, cb = in_batched
        x, cu = _bcast(x, n, xb), _bcast(cu, n, cb)
        T = x.shape[1]
        # Concatenate the mapped items' packed sequences into one longer pack.
        starts = cu[:, :-1] + (jnp.arange(n, dtype=cu.dtype) * T)[:, None]
        cu_all = jnp.concatenate([starts.reshape(-1), jnp.array([n * T], cu.dtype)])
        out = f(_fold(x), cu_all)
        return _unfold(out, n), True

    return f


def varlen_states(x, cu, state_len, backend):
    return _varlen_states_fn(state_len, backend)(x, cu)
