"""jax_causal_conv: causal depthwise conv1d for JAX, as XLA FFI custom calls.

    import jax_causal_conv as jcc
    y = jcc.causal_conv1d(x, weight, bias, activation="silu")

docs/semantics.md is the contract every backend follows.
"""

from . import reference
from ._lowering.targets import MAX_WIDTH, PLATFORMS, TARGETS, disabled_safety_checks
from .conv import causal_conv1d, causal_conv1d_varlen
from .decode import causal_conv1d_update, causal_conv1d_varlen_states

__version__ = "0.1.0"

__all__ = [
    "causal_conv1d",
    "causal_conv1d_varlen",
    "causal_conv1d_update",
    "causal_conv1d_varlen_states",
    "reference",
    "disabled_safety_checks",
    "TARGETS",
    "PLATFORMS",
    "MAX_WIDTH",
]
