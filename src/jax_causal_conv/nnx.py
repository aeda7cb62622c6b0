"""Flax NNX wrapper: :class:`CausalConv1d`, a depthwise causal conv over (B, L, D).

    from flax import nnx
    from jax_causal_conv.nnx import CausalConv1d
    conv = CausalConv1d(D, kernel_size=4, activation="silu", rngs=nnx.Rngs(0))
    y = conv(x)                                   # (B, L, D)

Decoding: ``conv.init_cache(batch_size)`` creates an ``nnx.Cache`` holding the
last ``W-1`` inputs, (B, W-1, D), at zeros; then ``conv(x, decode=True)`` with a
prompt of any length (prefill) and then one or more tokens at a time updates it
and gives the full-sequence outputs step by step. Steps of a few tokens run
the update kernel on the channels-last cache in place (no transposes).

Speculative decoding: with ``speculative_tokens=K`` the cache is a ring of
(B, W-1+K, D) inputs, ``cache_seqlens`` (B,) the tokens before the last decode
call and ``step_tokens`` (B,) how many of that call's are kept. Verify up to
K draft tokens (plus the last sampled one) in one ``conv(x, decode=True)``,
then ``conv.accept(a)`` (or :func:`accept` on a whole model) keeps only the
first ``a`` tokens of that call: the next step sees exactly the history the
accepted tokens alone leave. At most K tokens of a call may be rejected.

This module imports flax; ``import jax_causal_conv`` itself does not.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import jax.numpy as jnp
from flax import nnx

from . import _decode_cache as dc
from .flax import conv_apply, default_kernel_init

__all__ = ["CausalConv1d", "accept"]

_data = getattr(nnx, "data", lambda v: v)  # flax >= 0.11 wants None-or-Variable attrs marked


def _annotated(init, axes):
    return init if axes is None else nnx.with_partitioning(init, tuple(axes))


def _get(var):  # flax >= 0.12 deprecates .value
    return var.get_value() if hasattr(var, "get_value") else var.value


def _set(var, value):
    if hasattr(var, "set_value"):
        var.set_value(value)
    else:
        var.value = value


class CausalConv1d(nnx.Module):
    """Depthwise causal conv1d over (B, L, D) inputs (channels last).

    Args:
      features: number of channels ``D``.
      kernel_size: the width ``W``.
      use_bias: add a learned per-channel bias.
      activation: ``None`` or ``"silu"`` (alias ``"swish"``), fused in the kernel.
      dtype: computation dtype (default: inferred from inputs and params).
      param_dtype: dtype of ``kernel`` (D, W) and ``bias`` (D,).
      kernel_init / bias_init: their initialisers.
      kernel_axes / bias_axes: sharding names of ``kernel`` (2 entries) and
        ``bias`` (1 entry), logical or mesh axes, e.g. ``("embed", None)`` and
        ``("embed",)``, attached with ``nnx.with_partitioning`` (read back by
        ``nnx.get_partition_spec``). Default: no annotation.
      backend: ``"auto"``, ``"ffi"`` or ``"xla"`` (see :func:`causal_conv1d`).
      speculative_tokens: K, the most tokens of one decode call that
        :meth:`accept` may reject; K > 0 makes the cache a ring of W-1+K inputs.
      rngs: ``nnx.Rngs`` for the initialisers.
    """

    def __init__(self, features: int, kernel_size: int = 4, *, use_bias: bool = True,
                 activation: Optional[str] = None, dtype: Optional[Any] = None,
                 param_dtype: Any = jnp.float32, kernel_init: Callable = default_kernel_init,
                 bias_init: Callable = nnx.initializers.zeros_init(),
                 kernel_axes: Optional[Tuple[Optional[str], ...]] = None,
                 bias_axes: Optional[Tuple[Optional[str], ...]] = None, backend: str = "auto",
                 speculative_tokens: int = 0, rngs: nnx.Rngs):
        if not isinstance(speculative_tokens, int) or speculative_tokens < 0:
            raise ValueError("CausalConv1d: speculative_tokens must be an int >= 0, got "
                             f"{speculative_tokens!r}")
        self.features = features
        self.kernel_size = kernel_size
        self.use_bias = use_bias
        self.activation = activation
        self.dtype = dtype
        self.param_dtype = param_dtype
        self.backend = backend
        kernel_init, bias_init = _annotated(kernel_init, kernel_axes), _annotated(bias_init,
                                                                                  bias_axes)
        self.kernel = nnx.Param(kernel_init(rngs.params(), (features, kernel_size), param_dtype))
        self.bias = _data(nnx.Param(bias_init(rngs.params(), (features,), param_dtype))
                          if use_bias else None)
        self.speculative_tokens = speculative_tokens
        self.cache = _data(None)
        self.cache_seqlens = _data(None)  # ring caches: tokens before the last decode call (B,)
        self.step_tokens = _data(None)    # and how many of that call's are kept (B,)

    def init_cache(self, batch_size: int, dtype: Any = None):
        """Start decoding: a zero cache of the last ``W-1`` inputs, (B, W-1, D), or
        a ring of (B, W-1+K, D) with ``speculative_tokens=K``."""
        dtype = dtype or self.dtype or self.param_dtype
        K = self.speculative_tokens
        self.cache = nnx.Cache(jnp.zeros((batch_size, self.kernel_size - 1 + K, self.features),
                                         dtype))
        if K:
            self.cache_seqlens = nnx.Cache(jnp.zeros((batch_size,), jnp.int32))
            self.step_tokens = nnx.Cache(jnp.zeros((batch_size,), jnp.int32))

    def accept(self, num_accepted):
        """Keep the first ``num_accepted`` (scalar or (B,) int, clipped to [0,
        tokens of the last call]) tokens of the last decode call; the others are
        rolled back. Accepting twice is the same as once."""
        if self.cache_seqlens is None:
            raise ValueError("CausalConv1d.accept needs speculative_tokens > 0 and "
                             "init_cache(batch_size) first")
        seen, step = dc.accept(_get(self.cache_seqlens), _get(self.step_tokens), num_accepted)
        _set(self.cache_seqlens, seen)
        _set(self.step_tokens, step)

    def __call__(self, x, residual=None, *, decode: bool = False, seq_idx=None):
        """``x`` (B, L, D) -> (B, L, D); ``residual`` is added after the activation.
        With ``decode=True`` the cache (see :meth:`init_cache`) supplies the history
        and is updated with the newest ``W-1`` inputs."""
        if x.ndim != 3 or x.shape[-1] != self.features:
            raise ValueError(f"CausalConv1d: x must be (B, L, D={self.features}), got shape "
                             f"{x.shape}")
        bias = None if self.bias is None else _get(self.bias)
        if not decode:
            y, _ = conv_apply(x, _get(self.kernel), bias, activation=self.activation,
                              residual=residual, cache=None, dtype=self.dtype,
                              backend=self.backend, seq_idx=seq_idx)
            return y
        if self.cache is None:
            raise ValueError("CausalConv1d: decode=True needs a cache: call "
                             "init_cache(batch_size) first")
        if seq_idx is not None:
            raise ValueError("CausalConv1d: seq_idx cannot be combined with decode=True")
        if self.cache.shape[0] != x.shape[0]:
            raise ValueError(f"CausalConv1d: cache batch {self.cache.shape[0]} != x batch "
                             f"{x.shape[0]}; call init_cache({x.shape[0]})")
        ring = self.cache_seqlens is not None
        if ring:
            counts = dc.commit(_get(self.cache_seqlens), _get(self.step_tokens), x.shape[1])
        y, new = conv_apply(x, _get(self.kernel), bias, activation=self.activation,
                            residual=residual, cache=_get(self.cache), dtype=self.dtype,
                            backend=self.backend, seen=counts[0] if ring else None)
        _set(self.cache, new)
        if ring:
            _set(self.cache_seqlens, counts[0])
            _set(self.step_tokens, counts[1])
        return y


def accept(model, num_accepted):
    """Speculative decoding: :meth:`CausalConv1d.accept` on every ring-cached
    CausalConv1d of ``model`` (stacked layers included)."""
    for _, m in nnx.iter_graph(model):
        if isinstance(m, CausalConv1d) and m.cache_seqlens is not None:
            m.accept(num_accepted)
