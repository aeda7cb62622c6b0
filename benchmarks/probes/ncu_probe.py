"""Probe: one launch of each kernel of interest, for Nsight Compute (GPU).

`seq [W [f32]]` as the arguments: instead, the forward and the training
step of W=4 (or W) channels-first and channels-last, dense and with seq_idx
(8 segments, a padded tail), (8, 4096, 4096) bf16 (or float32); `wide`: the same at W=32
(the wide families). From the repository root:
    PYTHONPATH=src:. ncu --kernel-name regex:'Stream|ClRow|UpdateVec|input_reduce_slice' \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 -m benchmarks.probes.ncu_probe"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc

rng = np.random.default_rng(0)
dt = jnp.bfloat16


def run(f, *args):
    jax.block_until_ready(jax.jit(f)(*args))


if sys.argv[1:2] in (["seq"], ["wide"]):
    B, D, L = 8, 4096, 4096
    W = 32 if sys.argv[1] == "wide" else int(sys.argv[2]) if len(sys.argv) > 2 else 4
    dt = jnp.float32 if sys.argv[3:4] == ["f32"] else dt
    ids = np.full((B, L), -1, np.int32)
    ids[:, : L * 95 // 100] = np.arange(L * 95 // 100) * 8 // (L * 95 // 100)
    sidx = jnp.asarray(ids)
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    for cl in (False, True):
        x = jnp.asarray(rng.standard_normal((B, L, D) if cl else (B, D, L)), dt)
        g = jnp.asarray(rng.standard_normal(x.shape), dt)  # (not x: the same bytes twice flatter the backward)
        for s in (None, sidx):
            f = lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=s,
                                                  channels_last=cl, backend="ffi")
            run(f, x, w, b)
            run(lambda x, w, b, g: jax.vjp(f, x, w, b)[1](g), x, w, b, g)
    print("NCU PROBE OK")
    sys.exit(0)

for cl in (False, True):
    shape = (8, 4096, 4096)
    x = jnp.asarray(rng.standard_normal(shape), dt)
    w = jnp.asarray(rng.standard_normal((4096, 4)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((4096,)), dt)
    g = jnp.asarray(rng.standard_normal(shape), dt)
    for fn in (lambda x, w, b: jcc.causal_conv1d(x, w, b, channels_last=cl, backend="ffi"),
               lambda x, w, b: jcc.reference.causal_conv1d(x, w, b, channels_last=cl)):
        run(fn, x, w, b)
        run(jax.grad(lambda x, w, b, g: jnp.sum(fn(x, w, b).astype(jnp.float32) * g), argnums=(0, 1, 2)),
            x, w, b, g)
for B, D in ((64, 4096), (256, 8192)):
    w = jnp.asarray(rng.standard_normal((D, 4)), dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    x = jnp.asarray(rng.standard_normal((B, D)), dt)
    s = jnp.asarray(rng.standard_normal((B, D, 3)), dt)
    run(lambda x, s: jcc.causal_conv1d_update(x, s, w, b, activation="silu"), x, s)
print("NCU PROBE OK")
