"""Subcommands of ``jax-causal-conv`` / ``python -m jax_causal_conv``: demo, info, bench;
gpu_status says whether our kernels can run on a GPU here (and the fix when not)."""
