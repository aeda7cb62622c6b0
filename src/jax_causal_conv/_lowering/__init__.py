"""How the public functions reach the kernels.

- targets.py: the compiled modules and their registered FFI targets;
- config.py: a call's static configuration and the kernels' array convention;
- ffi_calls.py: one ``jax.ffi.ffi_call`` builder per target;
- xla_twins.py: the same four entry points in pure XLA (no kernel for the platform);
- dispatch.py: which of the two runs, and shard_map typing;
- batching.py: the ``custom_vmap`` entry points (forward, backward, update,
  varlen_states) that every public function calls.
"""
