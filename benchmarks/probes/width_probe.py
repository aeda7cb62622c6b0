"""Where each kernel family stands against XLA's shifted sum, across widths,
layouts and modes: device time per call (profiler) of the forward and of a
training step that keeps y (y and the vjp in one program).

    python -m benchmarks.probes.width_probe [B D L] [--widths 4,8,16] [--fwd-only]

Modes: dense; seq (8 segments, the last 5% padding, as the matrix); seq1 (one
id over the whole row: the cost of the seq_idx machinery alone); seq64 (64
segments, the last 5% padding).
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from benchmarks.timing import device_busy_us


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", nargs="*", type=int, default=[8, 4096, 4096])
    p.add_argument("--widths", default="2,4,5,8,12,16,32,64,128")
    p.add_argument("--modes", default="dense,seq")
    p.add_argument("--layouts", default="cf,cl")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--xla", action="store_true", help="also time the XLA shifted sum")
    p.add_argument("--fwd-only", action="store_true", help="no training step")
    a = p.parse_args()
    B, D, L = a.shape
    dt = jnp.dtype(a.dtype)
    rng = np.random.default_rng(0)

    def segments(n, pad):
        ids = np.repeat(np.arange(n), -(-L // n))[:L]
        if pad:
            ids[-max(1, L // 20):] = -1
        return jnp.asarray(np.tile(ids, (B, 1)), jnp.int32)

    sidx = {"dense": None, "seq": segments(8, True), "seq1": segments(1, False), "seq64": segments(64, True)}
    copy_us = None
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, ({B},{D},{L}) {dt.name}")
    for lay in a.layouts.split(","):
        cl = lay == "cl"
        x = jnp.asarray(rng.standard_normal((B, L, D) if cl else (B, D, L)), dt)
        g = jnp.asarray(rng.standard_normal(x.shape), dt)
        if copy_us is None:
            copy_us = device_busy_us(jax.jit(lambda x: -x), x)
            print(f"copy (-x): {copy_us:.1f} us")
        for W in [int(w) for w in a.widths.split(",")]:
            w = jnp.asarray(rng.standard_normal((D, W)) / W, dt)
            b = jnp.asarray(rng.standard_normal((D,)), dt)
            for mode in a.modes.split(","):
                s = sidx[mode]
                impls = [("ours", dict(backend="ffi"))] + ([("xla", dict(backend="xla"))] if a.xla else [])
                row = []
                for name, kw in impls:
                    def fwd(x, w, b):
                        return jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=s, channels_last=cl, **kw)

                    def step(x, w, b, g):
                        y, vjp = jax.vjp(fwd, x, w, b)
                        return y, vjp(g)

                    tf = device_busy_us(jax.jit(fwd), x, w, b)
                    row.append(f"{name} fwd {tf:8.1f} us ({copy_us / tf:5.1%} of copy)")
                    if not a.fwd_only:
                        ts = device_busy_us(jax.jit(step), x, w, b, g)
                        row[-1] += f"  step {ts:8.1f} us (floor 2.5 copies: {2.5 * copy_us / ts:5.1%})"
                print(f"{lay} W={W:3d} {mode:5s} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
