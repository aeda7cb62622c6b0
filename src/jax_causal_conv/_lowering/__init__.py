"""How the public functions reach the kernels.

- targets.py: the compiled modules and their registered FFI targets;
- config.py: a call's static configuration and the kernels' array convention;
- ffi_calls.py: one ``jax.ffi.ffi_call`` builder per target;
- xla_twins.py: the same four entry points in pure XLA (no kernel for the platform);
- dispatch.py: which of the two runs, and shard_map typing;
- kernels.py: each entry point on one device's block (kernel or twin);
- batching.py: the ``custom_vmap`` entry points (forward, backward, update,
  varlen_states) that every public function calls;
- partitioning.py: how each entry point splits over a device mesh under jit
  (sharding rules; custom_partitioning for Auto axes, shard_map for Explicit);
- shard_bodies.py: what each device runs on its blocks; halo.py: a split
  sequence's halo exchange, forward and backward.
"""
