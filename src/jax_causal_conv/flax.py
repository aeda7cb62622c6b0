"""Flax linen wrapper: :class:`CausalConv1d`, a depthwise causal conv over (B, L, D).

    from jax_causal_conv.flax import CausalConv1d
    conv = CausalConv1d(features=D, kernel_size=4, activation="silu")
    params = conv.init(rng, x)["params"]                 # kernel (D, W), bias (D,)
    y = conv.apply({"params": params}, x)                # (B, L, D)

Decoding, like ``flax.linen.MultiHeadDotProductAttention(decode=True)``: the
module keeps its history in the ``"cache"`` collection, channels-last, and a
decode step of a few tokens runs the update kernel on it in place (no
transposes). Initialise it with ``init(rng, x_like, decode=True)`` (the cache
starts at zeros), then call ``apply(vars, x, decode=True, mutable=["cache"])``
with a prompt of any length (prefill) and then with one or more new tokens at a
time: the outputs equal the full-sequence ones.

- ``speculative_tokens=0`` (default): ``conv_state`` is (B, W-1, D), the last
  ``W-1`` inputs, newest last (what ``causal_conv1d`` returns as final states).
- ``speculative_tokens=K``: ``conv_state`` is a ring of (B, W-1+K, D) entries
  with ``cache_seqlens`` (B,), the tokens before the last decode call, and
  ``step_tokens`` (B,), how many of that call's tokens are kept (all of them
  unless :func:`accept` keeps fewer); the stream holds their sum. Verify up
  to K draft tokens (plus the last sampled one) in one decode call, then keep
  only the first ``a`` of its tokens with
  :func:`accept` (the whole cache collection, any number of layers) or
  ``apply(vars, a, method=CausalConv1d.accept, mutable=["cache"])``: the next
  step sees exactly the history the accepted tokens alone leave. At most K
  tokens of a step may be rejected. docs/streaming.md has a worked example.

This module imports flax; ``import jax_causal_conv`` itself does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Optional, Tuple

import flax.core
import flax.linen as nn
import jax.numpy as jnp

from . import _decode_cache as dc
from .conv import causal_conv1d

__all__ = ["CausalConv1d", "accept", "default_kernel_init"]

# lecun-normal over the depthwise fan-in: each output channel sees W inputs.
default_kernel_init = nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=0)


def _annotated(init, axes):
    return init if axes is None else nn.with_logical_partitioning(init, tuple(axes))


def conv_apply(x, kernel, bias, *, activation, residual, cache, dtype, backend, seq_idx=None,
               seen=None):
    """Shared by the linen and nnx modules: (y, new_cache or None). ``cache`` is
    the channels-last decode state: ordered (B, W-1, D), or a ring when
    ``seen`` (B,) gives its stream lengths (_decode_cache.py)."""
    if dtype is None:
        dtype = jnp.result_type(x, kernel, *(() if bias is None else (bias,)))
    x = jnp.asarray(x, dtype)
    kernel = jnp.asarray(kernel, dtype)
    bias = None if bias is None else jnp.asarray(bias, dtype)
    residual = None if residual is None else jnp.asarray(residual, dtype)
    if cache is None:
        y = causal_conv1d(x, kernel, bias, activation=activation, residual=residual,
                          seq_idx=seq_idx, channels_last=True, backend=backend)
        return y, None
    kw = dict(activation=activation, residual=residual, backend=backend)
    if seen is None:
        return dc.ordered_step(x, kernel, bias, state=cache, **kw)
    return dc.ring_step(x, kernel, bias, ring=cache, seen=seen, **kw)


_RING_KEYS = ("conv_state", "cache_seqlens", "step_tokens")


def accept(cache, num_accepted):
    """Speculative decoding: keep the first ``num_accepted`` tokens (scalar or
    (B,) int) of the last decode call in every ring cache of ``cache`` (a
    model's whole ``"cache"`` collection, stacked layers included) and return
    the new collection. Values are clipped to [0, tokens of that call];
    accepting twice is the same as once."""
    def walk(node):
        if not isinstance(node, Mapping):
            return node
        if all(k in node for k in _RING_KEYS):
            seen, step = dc.accept(node["cache_seqlens"], node["step_tokens"], num_accepted)
            out = {**node, "cache_seqlens": seen, "step_tokens": step}
        else:
            out = {k: walk(v) for k, v in node.items()}
        return flax.core.freeze(out) if isinstance(node, flax.core.FrozenDict) else out
    return walk(cache)


class CausalConv1d(nn.Module):
    """Depthwise causal conv1d over (B, L, D) inputs (channels last).

    Attributes:
      features: number of channels ``D``.
      kernel_size: the width ``W``.
      use_bias: add a learned per-channel bias.
      activation: ``None`` or ``"silu"`` (alias ``"swish"``), fused in the kernel.
      dtype: computation dtype (default: inferred from inputs and params).
      param_dtype: dtype of ``kernel`` and ``bias``.
      kernel_init / bias_init: initialisers of ``kernel`` (D, W) and ``bias`` (D,).
      kernel_axes / bias_axes: logical axis names of ``kernel`` (2 names) and
        ``bias`` (1 name), e.g. ``("embed", None)`` and ``("embed",)``: the params
        are created boxed by ``nn.with_logical_partitioning`` for
        ``nn.logical_to_mesh_sharding``. Default: no annotation.
      backend: ``"auto"``, ``"ffi"`` or ``"xla"`` (see :func:`causal_conv1d`).
      speculative_tokens: K, the most tokens of one decode call that
        :meth:`accept` may reject; K > 0 makes the cache a ring of W-1+K inputs.
    """

    features: int
    kernel_size: int = 4
    use_bias: bool = True
    activation: Optional[str] = None
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    kernel_init: Callable = default_kernel_init
    bias_init: Callable = nn.initializers.zeros_init()
    kernel_axes: Optional[Tuple[Optional[str], ...]] = None
    bias_axes: Optional[Tuple[Optional[str], ...]] = None
    backend: str = "auto"
    speculative_tokens: int = 0

    @nn.compact
    def __call__(self, x, residual=None, *, decode: bool = False, seq_idx=None):
        """``x`` (B, L, D) -> (B, L, D). ``residual`` (B, L, D) is added after the
        activation. With ``decode=True`` the ``"cache"`` collection carries the last
        ``W-1`` inputs across calls (pass ``mutable=["cache"]`` to ``apply``)."""
        if x.ndim != 3 or x.shape[-1] != self.features:
            raise ValueError(f"CausalConv1d: x must be (B, L, D={self.features}), got shape "
                             f"{x.shape}")
        kernel = self.param("kernel", _annotated(self.kernel_init, self.kernel_axes),
                            (self.features, self.kernel_size), self.param_dtype)
        bias = (self.param("bias", _annotated(self.bias_init, self.bias_axes), (self.features,),
                           self.param_dtype) if self.use_bias else None)
        if not decode:
            y, _ = conv_apply(x, kernel, bias, activation=self.activation, residual=residual,
                              cache=None, dtype=self.dtype, backend=self.backend,
                              seq_idx=seq_idx)
            return y
        if seq_idx is not None:
            raise ValueError("CausalConv1d: seq_idx cannot be combined with decode=True")
        dtype = self.dtype or jnp.result_type(x, kernel)
        B, K = x.shape[0], self.speculative_tokens
        if not isinstance(K, int) or K < 0:
            raise ValueError(f"CausalConv1d: speculative_tokens must be an int >= 0, got {K!r}")
        is_initialized = self.has_variable("cache", "conv_state")
        cache = self.variable("cache", "conv_state", jnp.zeros,
                              (B, self.kernel_size - 1 + K, self.features), dtype)
        if K:
            seen = self.variable("cache", "cache_seqlens", jnp.zeros, (B,), jnp.int32)
            step = self.variable("cache", "step_tokens", jnp.zeros, (B,), jnp.int32)
            counts = dc.commit(seen.value, step.value, x.shape[1])
        y, new = conv_apply(x, kernel, bias, activation=self.activation, residual=residual,
                            cache=cache.value, dtype=self.dtype, backend=self.backend,
                            seen=counts[0] if K else None)
        # like flax attention, init() only creates the (zero) cache
        if is_initialized or not self.is_initializing():
            cache.value = new
            if K:
                seen.value, step.value = counts
        return y

    def accept(self, num_accepted):
        """Keep the first ``num_accepted`` (scalar or (B,)) tokens of the last
        decode call, e.g. ``apply(vars, a, method=CausalConv1d.accept,
        mutable=["cache"])``; the rest are rolled back. Needs
        ``speculative_tokens > 0``; for a whole model use :func:`accept` on its
        cache collection."""
        if not self.speculative_tokens:
            raise ValueError("CausalConv1d.accept needs speculative_tokens > 0 (a ring cache)")
        seen, step = dc.accept(self.get_variable("cache", "cache_seqlens"),
                               self.get_variable("cache", "step_tokens"), num_accepted)
        self.put_variable("cache", "cache_seqlens", seen)
        self.put_variable("cache", "step_tokens", step)
