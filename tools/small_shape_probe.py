"""(32,512,1024) bf16 forward, 16 independent calls in one program: run under
ncu to see the kernel time apart from XLA's work around it."""
import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from jax_causal_conv.bench import batched

rng = np.random.default_rng(0)
x = jnp.asarray(rng.standard_normal((32, 512, 1024)), jnp.bfloat16)
w = jnp.asarray(rng.standard_normal((512, 4)), jnp.bfloat16)
b = jnp.asarray(rng.standard_normal((512,)), jnp.bfloat16)
xs = tuple(x * (1 + i / 4) for i in range(4))
f = batched(lambda x, w, b: jcc.causal_conv1d(x, w, b, backend="ffi"))
jax.block_until_ready(f(xs, w, b))
print(f.lower(xs, w, b).compile().as_text().count("custom-call"), "custom calls;",
      f.lower(xs, w, b).compile().as_text().count(" copy"), "copies")
