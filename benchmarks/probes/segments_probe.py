"""Probe: what seq_idx costs over dense, by the ids' shape (GPU).

Device time (profiler: the GPU's busy time per call, over 10 calls) of the
forward and of the backward (a vjp, whose unused forward XLA drops) at
(8, 4096, 4096) bf16, bias + SiLU, for dense and for seq_idx rows of: one
sequence (every step plain, no masks), one sequence with the matrix's
padded tail, the matrix's 8 segments with the padded tail, 64 and 512
segments (8 steps each: every output's window crosses a change once W > 8).
If one sequence already costs what 8 do, the masked steps are not the gap;
the kernels' structure is. `fwd` times the forward only, `bwd` the backward
only (the forward's and XLA's columns then nan); the last column is the
jitted XLA shifted sum (jax_causal_conv.reference) of the same call.
From the repository root on a GPU machine:
    PYTHONPATH=src:. python3 -m benchmarks.probes.segments_probe [W,W,..] [cl] [fwd|bwd] [f32] [rows=0,1,..]
(`f32`: float32 instead of bf16; `rows=` keeps those of the id rows
above, by position: dense is row 0 and always measured, as the ratios'
base.)"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from jax_causal_conv import reference
from benchmarks import matrix_cells as mc
from benchmarks.timing import device_busy_us

B, D, L = 8, 4096, 4096
widths = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4, 8, 16]
cl = "cl" in sys.argv[2:]
fwd_only = "fwd" in sys.argv[2:]
bwd_only = "bwd" in sys.argv[2:]
dt = jnp.float32 if "f32" in sys.argv[2:] else jnp.bfloat16
rng = np.random.default_rng(0)


def rows(segments, pad_fraction):
    return jnp.asarray(np.tile(np.asarray(mc.seq_idx_row(L, segments, pad_fraction), np.int32), (B, 1)))


IDS = {"dense": None,
       "1 segment": rows(1, 0.0),
       "1 + pad": rows(1, mc.PAD_FRACTION),
       "8 + pad (matrix)": rows(8, mc.PAD_FRACTION),
       "64 + pad": rows(64, mc.PAD_FRACTION),
       "512 + pad": rows(512, mc.PAD_FRACTION)}
picked = [a for a in sys.argv[2:] if a.startswith("rows=")]
if picked:
    keep = {0} | {int(v) for v in picked[-1][5:].split(",")}
    IDS = {k: v for i, (k, v) in enumerate(IDS.items()) if i in keep}


x = jnp.asarray(rng.standard_normal((B, L, D) if cl else (B, D, L)), dt)
# (a cotangent of its own: with x as the cotangent the backward reads the
# same bytes twice and L2 flatters the dense kernel most)
g = jnp.asarray(rng.standard_normal(x.shape), dt)
print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}, ({B}, {D}, {L}) {jnp.dtype(dt).name}, "
      f"{'channels-last' if cl else 'channels-first'}, bias + SiLU; device µs per call")
print("| W | ids | forward | backward | forward / dense | backward / dense | XLA forward |")
print("|---:|---|---:|---:|---:|---:|---:|")
for W in widths:
    w = jnp.asarray(rng.standard_normal((D, W)) / 2, dt)
    b = jnp.asarray(rng.standard_normal((D,)), dt)
    base = None
    for name, s in IDS.items():
        conv = lambda x, w, b, s=s: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=s,
                                                       channels_last=cl, backend="ffi")
        fwd = jax.jit(conv)
        xla = jax.jit(lambda x, w, b, s=s: reference.causal_conv1d(x, w, b, activation="silu", seq_idx=s,
                                                                   channels_last=cl))
        bwd = jax.jit(lambda x, w, b, g, conv=conv: jax.vjp(conv, x, w, b)[1](g))
        tf = float("nan") if bwd_only else device_busy_us(fwd, x, w, b)
        tb = float("nan") if fwd_only else device_busy_us(bwd, x, w, b, g)
        base = base or (tf, tb)
        tx = float("nan") if bwd_only else device_busy_us(xla, x, w, b)  # (XLA's shifted sum, the same masks)
        print(f"| {W} | {name} | {tf:.1f} | {tb:.1f} | {tf / base[0]:.2f} | {tb / base[1]:.2f} | {tx:.1f} |",
              flush=True)
