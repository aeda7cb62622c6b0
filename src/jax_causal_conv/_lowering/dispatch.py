"""Choosing between our FFI kernel and its pure-XLA twin for the platform a
call runs on, and keeping shard_map's varying-axes types consistent."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from . import targets


def vma(a):
    """The shard_map mesh axes ``a`` varies over (empty outside shard_map)."""
    if a is None:
        return frozenset()
    t = jax.typeof(a)
    v = getattr(t, "vma", None)  # older jax spelling
    if v is None:
        v = getattr(getattr(t, "mat", None), "varying", ())
    return frozenset(v)


def union_vma(args):
    return frozenset().union(*(vma(a) for a in jax.tree.leaves(args)))


def to_varying(tree, axes):
    """Type-level cast (no runtime op) of every leaf to vary over ``axes``."""
    def cast(o):
        rest = tuple(sorted(axes - vma(o)))
        if not rest:
            return o
        return lax.pcast(o, rest, to="varying") if hasattr(lax, "pcast") else lax.pvary(o, rest)
    return jax.tree.map(cast, tree) if axes else tree


def dispatch(backend, ffi_fn, xla_fn, dtype, *args, gpu_kernel=True, cpu_kernel=True):
    """The FFI kernel where one exists for the platform, else the XLA twin;
    ``gpu_kernel=False`` / ``cpu_kernel=False``: the twin on a GPU / the CPU
    too unless the backend is "ffi" (routing.py says where).

    Under shard_map, ffi_call types its results from the ShapeDtypeStructs, as
    device-invariant; they are cast to vary over the inputs' mesh axes (as the
    XLA twin's do), so the branches match and transposes stay correct."""
    axes = union_vma(args)
    if axes:
        ffi_raw = ffi_fn
        ffi_fn = lambda *a: to_varying(ffi_raw(*a), axes)  # noqa: E731
    if backend == "ffi":
        return ffi_fn(*args)
    kernels = {p: ffi_fn for p in targets.PLATFORMS
               if not (p == "cuda" and (dtype == jnp.float64 or not gpu_kernel))
               and not (p == "cpu" and not cpu_kernel)}
    return lax.platform_dependent(*args, default=xla_fn, **kernels)
