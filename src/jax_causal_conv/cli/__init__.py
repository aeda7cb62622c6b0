"""Subcommands of ``jax-causal-conv`` / ``python -m jax_causal_conv``: demo, info, bench."""
