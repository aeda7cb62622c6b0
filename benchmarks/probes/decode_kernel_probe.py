"""Probe: does the donated decode state keep its buffer; what does the update kernel cost? (GPU)

Run under Nsight Compute for the kernel times, from the repository root:
    PYTHONPATH=src:. ncu --kernel-name regex:Update --metrics gpu__time_duration.sum \
        python3 -m benchmarks.probes.decode_kernel_probe"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc

rng = np.random.default_rng(0)
for B, D in ((64, 4096), (256, 8192)):
    dt = jnp.bfloat16
    w = jnp.asarray(rng.standard_normal((D, 4)), dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    x = jnp.asarray(rng.standard_normal((B, D)), dt)
    s = jnp.asarray(rng.standard_normal((B, D, 3)), dt)

    @functools.partial(jax.jit, donate_argnums=(1,))
    def step(x, s):
        return jcc.causal_conv1d_update(x, s, w, b, activation="silu")

    for _ in range(3):
        p_in = s.unsafe_buffer_pointer()
        y, s = step(x, s)
        print(f"B={B} D={D}: state buffer kept in place: {s.unsafe_buffer_pointer() == p_in}", flush=True)
    jax.block_until_ready(s)
