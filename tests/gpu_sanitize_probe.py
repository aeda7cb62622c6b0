"""A few forward and backward calls on shapes that take every CUDA path
(streaming, tiled, channels-last; partial and multiple tiles), compared with
the CPU kernels, small enough to run under compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tests/gpu_sanitize_probe.py
"""
import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc

cpu = jax.devices("cpu")[0]
rng = np.random.default_rng(0)
n = 0
CONFIGS = [  # dtype, (B, D, L), W, channels_last
    (jnp.bfloat16, (2, 12, 520), 4, False),   # streaming, one partial tile
    (jnp.bfloat16, (1, 3, 4104), 2, False),   # streaming, several tiles
    (jnp.float32, (1, 3, 4104), 4, False),
    (jnp.bfloat16, (8, 4096, 1032), 4, False),  # streaming backward, warps spanning 2 chunks
    (jnp.float32, (2, 12, 520), 1, False),
    (jnp.bfloat16, (2, 5, 67), 4, False),     # tiled (rows not whole vectors)
    (jnp.bfloat16, (2, 12, 520), 4, True),    # channels-last (lean backward: dim % 4 == 0)
    (jnp.float32, (2, 8, 1100), 3, True),     # channels-last, several chunks
    (jnp.bfloat16, (2, 6, 300), 2, True),     # channels-last, general backward (dim % 4 != 0)
    (jnp.float32, (2, 5, 67), 5, True),       # general width
]
for dt, (B, D, L), W, cl in CONFIGS:
    shape = (B, L, D) if cl else (B, D, L)
    x = jnp.asarray(rng.standard_normal(shape), dt)
    h = jnp.asarray(rng.standard_normal((B, W - 1, D) if cl else (B, D, W - 1)), dt)
    r = jnp.asarray(rng.standard_normal(shape), dt)
    w, b = jnp.asarray(rng.standard_normal((D, W)), dt), jnp.asarray(rng.standard_normal((D,)), dt)

    def loss(x, w, b, h, r):
        y, f = jcc.causal_conv1d(x, w, b, activation="silu", residual=r, initial_states=h,
                                 return_final_states=True, channels_last=cl)
        return jnp.sum(y.astype(jnp.float32) ** 2) + jnp.sum(f.astype(jnp.float32))

    g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
    out = g(x, w, b, h, r)
    ref = g(*(jax.device_put(a, cpu) for a in (x, w, b, h, r)))
    for a, e in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        tol = 0.05 if dt == jnp.bfloat16 else 1e-3
        assert np.allclose(a, e, rtol=tol, atol=tol * (1 + np.abs(e).max(initial=0))), (dt, B, D, L, W, cl)
    n += 1
# decode: the vector kernel (state_len = W - 1, dim % 4 == 0) and the
# general one, rolling and circular, with a padding row; (3, 256): 4
# channels, one row per thread; (100, 4096): 8 channels, one row per thread,
# warps staging their state rows in shared memory; (600, 2048): 8 channels
# and several rows per thread, staged; (400, 1028): 4 channels, several rows
# per thread
for B, D, SL in ((3, 48, 3), (3, 36, 5), (3, 256, 3), (100, 4096, 3), (600, 2048, 3), (400, 1028, 3)):
    x = jnp.asarray(rng.standard_normal((B, D)), jnp.bfloat16)
    st = jnp.asarray(rng.standard_normal((B + 1, D, SL)), jnp.bfloat16)
    w, b = jnp.asarray(rng.standard_normal((D, 4)), jnp.float32), jnp.asarray(rng.standard_normal((D,)), jnp.float32)
    idx = np.arange(B, dtype=np.int32)[::-1].copy()
    idx[1] = -1
    for kw in ({}, {"cache_seqlens": jnp.asarray(np.arange(B) * 5 % 7, jnp.int32),
                    "conv_state_indices": jnp.asarray(idx)}):
        f = jax.jit(lambda x, st: jcc.causal_conv1d_update(x, st, w, b, activation="silu", **kw))
        out = f(x, st)
        ref = f(*(jax.device_put(a, cpu) for a in (x, st)))
        for a, e in zip(out, ref):
            assert np.allclose(np.asarray(a, np.float32), np.asarray(e, np.float32), rtol=0.05, atol=0.05)
        n += 1
print(f"PROBE OK: {n} configurations")
