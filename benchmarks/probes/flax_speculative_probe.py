"""Probe: what the Flax speculative ring cache's bookkeeping costs a decode step.

A 32-layer linen stack of CausalConv1d (channels-last cache) decoding one
token, `speculative_tokens` 0 against 3 (the ring cache and its counters),
beside the raw update without and with the ring (cache_seqlens), both state
layouts; back to back and as device time (GPU).

    PYTHONPATH=src:. python3 -m benchmarks.probes.flax_speculative_probe [--platform gpu] [--sizes 64x4096]
"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import argparse
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from jax_causal_conv.flax import CausalConv1d

from ..timing import device_times, timeit_interleaved

LAYERS, W, K = 32, 4, 3


class Stack(nn.Module):
    D: int
    K: int
    dt: object = jnp.bfloat16

    @nn.compact
    def __call__(self, x, decode=False):
        for i in range(LAYERS):
            x = CausalConv1d(features=self.D, kernel_size=W, activation="silu",
                             speculative_tokens=self.K, param_dtype=self.dt,
                             name=f"c{i}")(x, decode=decode)
        return x


def linen_runner(B, D, k, dt, hlo_to=None):
    m = Stack(D, k, dt)
    x = jnp.ones((B, 8, D), dt)
    params = m.init(jax.random.key(1), x)["params"]
    cache = m.init(jax.random.key(0), x, decode=True)["cache"]
    step = jax.jit(lambda p, c, t: m.apply({"params": p, "cache": c}, t, decode=True,
                                           mutable=["cache"]), donate_argnums=1)
    if hlo_to:
        with open(hlo_to, "w") as f:
            f.write(step.lower(params, cache, x[:, :1]).compile().as_text())
    box = [cache]

    def run(tok):
        y, mut = step(params, box[0], tok)
        box[0] = mut["cache"]
        return y
    return run


def raw_runner(B, D, ring, book, dt, cl=False):
    """The raw update of every layer; `book`, the ring's per-layer counters:
    None (passed through unchanged), "advance" (the update reads seen, then
    seen + 1 and a fresh step count are stored), "commit" (seen + step is
    stored and read by the update, and a fresh step count: the Flax
    modules' form)."""
    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(LAYERS)]

    @functools.partial(jax.jit, donate_argnums=(0, 1, 2))
    def step(states, seen, steps, x):
        new, ns, nt = [], [], []
        for layer in range(LAYERS):
            c, t = seen[layer], steps[layer]
            if book == "commit":
                c = c + t
            x, s = jcc.causal_conv1d_update(x, states[layer], ws[layer], activation="silu",
                                            cache_seqlens=c if ring else None,
                                            channels_last=cl)
            new.append(s)
            if book == "advance":
                c = c + 1
            ns.append(c)
            nt.append(t if book is None else jnp.full(t.shape, 1, t.dtype))
        return new, ns, nt, x
    state_len = W - 1 + (K if ring else 0)
    box = [[jnp.zeros((B, state_len, D) if cl else (B, D, state_len), dt) for _ in range(LAYERS)],
           [jnp.zeros((B,), jnp.int32) for _ in range(LAYERS)],
           [jnp.zeros((B,), jnp.int32) for _ in range(LAYERS)]]

    def run(tok):
        box[0], box[1], box[2], y = step(box[0], box[1], box[2], tok)
        return y
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--platform", default="gpu")
    p.add_argument("--sizes", default="64x4096")
    p.add_argument("--hlo-dir", help="write each linen step's compiled HLO here")
    a = p.parse_args()
    dt = jnp.bfloat16
    with jax.default_device(jax.devices(a.platform)[0]):
        for size in a.sizes.split(","):
            B, D = map(int, size.split("x"))
            tok3 = jnp.ones((B, 1, D), dt)
            tok2 = jnp.ones((B, D), dt)
            progs = {"update": (raw_runner(B, D, False, None, dt), tok2),
                     "update + ring": (raw_runner(B, D, True, None, dt), tok2),
                     "update (cl)": (raw_runner(B, D, False, None, dt, True), tok2),
                     "update + ring (cl)": (raw_runner(B, D, True, None, dt, True), tok2),
                     "update + ring (cl), counters advanced": (
                         raw_runner(B, D, True, "advance", dt, True), tok2),
                     "update + ring (cl), counters committed": (
                         raw_runner(B, D, True, "commit", dt, True), tok2),
                     **{f"linen K={k}": (linen_runner(B, D, k, dt, a.hlo_dir and
                                                      f"{a.hlo_dir}/linen_K{k}_B{B}.txt"), tok3)
                        for k in (0, K)}}
            for f, t in progs.values():
                jax.block_until_ready(f(t))
            wall = timeit_interleaved({k: (f, (t,), 1) for k, (f, t) in progs.items()},
                                      reps=15, min_sample_s=0.02)
            dev = device_times({k: (f, (t,), 1) for k, (f, t) in progs.items()}, n=10)
            for k in progs:
                d = dev.get(k)
                print(f"B={B} D={D} {k}: {wall[k] * 1e6 / LAYERS:.2f} us a layer back to back"
                      + (f", device {d / LAYERS:.2f}" if d else ""), flush=True)


if __name__ == "__main__":
    main()
