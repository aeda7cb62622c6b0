"""Probe: the GPU kernels one call runs, each with its device time, for the
forward and the training step of each (width, layout, mode) asked for.

    python -m benchmarks.probes.kernel_list_probe [B D L] [--widths 1,4] [--modes dense,seq]
"""
import argparse
import collections

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from benchmarks.timing import device_events


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("shape", nargs="*", type=int, default=[8, 4096, 4096])
    p.add_argument("--widths", default="1,4")
    p.add_argument("--modes", default="dense,seq")
    p.add_argument("--layouts", default="cf")
    a = p.parse_args()
    B, D, L = a.shape
    rng = np.random.default_rng(0)
    ids = np.repeat(np.arange(8), -(-L // 8))[:L]
    ids[-max(1, L // 20):] = -1
    sidx = jnp.asarray(np.tile(ids, (B, 1)), jnp.int32)
    n = 5
    for lay in a.layouts.split(","):
        cl = lay == "cl"
        x = jnp.asarray(rng.standard_normal((B, L, D) if cl else (B, D, L)), jnp.bfloat16)
        g = jnp.ones_like(x)
        for W in map(int, a.widths.split(",")):
            w = jnp.asarray(rng.standard_normal((D, W)) / W, jnp.bfloat16)
            b = jnp.zeros((D,), jnp.bfloat16)
            for mode in a.modes.split(","):
                def fwd(x, w, b, s):
                    return jcc.causal_conv1d(x, w, b, activation="silu", channels_last=cl,
                                             seq_idx=s if mode == "seq" else None)

                def step(x, w, b, s, g):
                    y, vjp = jax.vjp(lambda x, w, b: fwd(x, w, b, s), x, w, b)
                    return y, vjp(g)
                for name, f, args in (("fwd", fwd, (x, w, b, sidx)),
                                      ("step", step, (x, w, b, sidx, g))):
                    ev = device_events(jax.jit(f), *args, n=n)
                    per = collections.defaultdict(float)
                    for k, s0, e0 in ev:
                        per[k[:70]] += (e0 - s0) / 1e3 / n
                    print(f"{lay} W={W} {mode} {name}: " +
                          "; ".join(f"{k} {v:.1f} us" for k, v in per.items()), flush=True)


if __name__ == "__main__":
    main()
