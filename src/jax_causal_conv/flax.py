"""Flax linen wrapper: :class:`CausalConv1d`, a depthwise causal conv over (B, L, D).

    from jax_causal_conv.flax import CausalConv1d
    conv = CausalConv1d(features=D, kernel_size=4, activation="silu")
    params = conv.init(rng, x)["params"]                 # kernel (D, W), bias (D,)
    y = conv.apply({"params": params}, x)                # (B, L, D)

Decoding, like ``flax.linen.MultiHeadDotProductAttention(decode=True)``: the
module keeps the last ``W-1`` inputs in the ``"cache"`` collection, shaped
(B, W-1, D). Initialise it with ``init(rng, x_like, decode=True)`` (the cache
starts at zeros), then call ``apply(vars, x, decode=True, mutable=["cache"])``
with a prompt of any length (prefill) and then with one or more new tokens at a
time: the outputs equal the full-sequence ones.

This module imports flax; ``import jax_causal_conv`` itself does not.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp

from .conv import causal_conv1d

__all__ = ["CausalConv1d", "default_kernel_init"]

# lecun-normal over the depthwise fan-in: each output channel sees W inputs.
default_kernel_init = nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=0)


def _annotated(init, axes):
    return init if axes is None else nn.with_logical_partitioning(init, tuple(axes))


def conv_apply(x, kernel, bias, *, activation, residual, cache, dtype, backend, seq_idx=None):
    """Shared by the linen and nnx modules: (y, new_cache or None)."""
    if dtype is None:
        dtype = jnp.result_type(x, kernel, *(() if bias is None else (bias,)))
    x = jnp.asarray(x, dtype)
    kernel = jnp.asarray(kernel, dtype)
    bias = None if bias is None else jnp.asarray(bias, dtype)
    residual = None if residual is None else jnp.asarray(residual, dtype)
    W = kernel.shape[-1]
    if cache is None:
        y = causal_conv1d(x, kernel, bias, activation=activation, residual=residual,
                          seq_idx=seq_idx, channels_last=True, backend=backend)
        return y, None
    if W == 1:  # no history to carry
        y = causal_conv1d(x, kernel, bias, activation=activation, residual=residual,
                          channels_last=True, backend=backend)
        return y, cache
    y, final = causal_conv1d(x, kernel, bias, activation=activation, residual=residual,
                             initial_states=jnp.asarray(cache, dtype), return_final_states=True,
                             channels_last=True, backend=backend)
    return y, final.astype(cache.dtype)


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
        is_initialized = self.has_variable("cache", "conv_state")
        cache = self.variable("cache", "conv_state", jnp.zeros,
                              (x.shape[0], self.kernel_size - 1, self.features), dtype)
        y, new = conv_apply(x, kernel, bias, activation=self.activation, residual=residual,
                            cache=cache.value, dtype=self.dtype, backend=self.backend)
        # like flax attention, init() only creates the (zero) cache
        if is_initialized or not self.is_initializing():
            cache.value = new
        return y
