"""PyTorch adapter: a drop-in for Dao-AILab ``causal_conv1d`` 1.7's public API
on this package's kernels.

    from jax_causal_conv.torch import causal_conv1d_fn, causal_conv1d_update
    y = causal_conv1d_fn(x, weight, bias, activation="silu")   # x (B, D, L)

- ``causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None,
  return_final_states=False, final_states_out=None, activation=None)``
- ``causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
  cache_seqlens=None, conv_state_indices=None)``: updates ``conv_state`` in place
- ``causal_conv1d_varlen_states(x, cu_seqlens, state_len)``
- ``causal_conv1d_ref``, ``causal_conv1d_update_ref``,
  ``causal_conv1d_varlen_states_ref``: plain-torch references

Semantics are the package's (docs/semantics.md), which extend Dao's: widths
1 to MAX_WIDTH, weight/bias of a dtype other than x's, float64 on CPU,
``seq_idx`` in both layouts and together with ``initial_states`` (the
history of each row's first segment) and ``return_final_states`` (the last
width-1 inputs of each row's last segment), ids < 0 marking padding (zero
output), and final states for channel-first x too.

Layouts follow Dao's library: ``x`` (batch, dim, seqlen) is channel-last
when ``x.stride(1) == 1 and x.stride(2) > 1`` (a transposed view of a
(batch, seqlen, dim) tensor), else channel-first; the output has x's layout.
States (batch, dim, width-1) are likewise channel-last when ``stride(1) ==
1``. Returned final states take the layout of ``initial_states``, else of
``final_states_out``, else of ``x``. A strided x (a slice of a wider tensor,
e.g. Mamba's ``x, z = xz.chunk(2, dim=1)``) reaches the kernels without a
copy when their module accepts strided inputs, else as a dense copy; other
inputs not dense in their layout are copied. ``conv_state`` may be
channel-last ((num_slots, state_len, dim) storage) where the kernels
support it. Every returned tensor is an ordinary tensor that may be
modified in place, under autograd too.

Tensors reach the C++/CUDA kernels through DLPack (no copy); CUDA tensors
run on torch's current stream. The kernels are ``torch.library`` custom ops
(ops.py) with fakes and autograd formulas, so ``torch.compile(fullgraph=True)``
traces them without graph breaks and ``torch.autograd`` differentiates
``causal_conv1d_fn``. Eager calls that need none of that run the kernels
directly (direct.py), skipping the dispatcher's host overhead.

``import jax_causal_conv`` never needs torch; this package does.
"""

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("jax_causal_conv.torch needs PyTorch: pip install 'jax-causal-conv[torch]'") from e

from .api import causal_conv1d_fn, causal_conv1d_update, causal_conv1d_varlen_states
from .reference import causal_conv1d_ref, causal_conv1d_update_ref, causal_conv1d_varlen_states_ref

__all__ = [
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "causal_conv1d_varlen_states",
    "causal_conv1d_ref",
    "causal_conv1d_update_ref",
    "causal_conv1d_varlen_states_ref",
]
