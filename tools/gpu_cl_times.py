"""Channels-last (8,4096,4096) bf16 W=4: ours vs the same-run `-x` copy (kernel development)."""
import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from jax_causal_conv.bench import _grad, timeit

rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((8, 4096, 4096)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((4096, 4)) / 2, jnp.bfloat16)
b = jnp.asarray(rng.standard_normal((4096,)), jnp.bfloat16)
ours = lambda x, w, b: jcc.causal_conv1d(x, w, b, channels_last=True, backend="ffi")  # noqa: E731
for _ in range(2):
    tc = timeit(jax.jit(lambda x: -x), x, reps=20, calls=10)
    to = timeit(jax.jit(ours), x, w, b, reps=20, calls=10)
    tb = timeit(jax.jit(_grad(ours)), x, w, b, x, reps=20, calls=10)
    print(f"CL copy {tc*1e3:.4f} ms  ours fwd {to*1e3:.4f} ms ({tc/to:.1%})  fwd+bwd {tb*1e3:.4f} ms", flush=True)
