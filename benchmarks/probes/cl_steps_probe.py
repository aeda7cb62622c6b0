"""The channels-last row kernels' slice (time steps a thread) against the
grid's size: device time per call (profiler) of the forward (or the
backward alone, --bwd) at each slice the kernel takes (JCC_CL_FWD_STEPS,
JCC_CL_BWD_STEPS), beside the plan's own choice (auto), all in one trace
per round.

    python -m benchmarks.probes.cl_steps_probe [--shapes 8x4096x4096,1x8192x2048]
        [--widths 4,5,8,12,16] [--modes dense,seq] [--dtype bfloat16] [--rounds 3] [--bwd]
        [--auto-only] [--json FILE]

Modes: dense; seq (8 segments, the last 5% padding, as the matrix).
"""
import argparse
import json
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from benchmarks.timing import device_times

def base_steps(width):
    return 32 if width <= 4 else 64 if width <= 8 else 128


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="8x4096x4096,4x4096x4096,2x4096x4096,1x8192x2048")
    p.add_argument("--widths", default="4,5,8,12,16")
    p.add_argument("--modes", default="dense,seq")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bwd", action="store_true", help="the backward alone (no forward kept)")
    p.add_argument("--auto-only", action="store_true",
                   help="only the plan's own slice (compile-time sweeps: tools/param_sweep.sh)")
    p.add_argument("--json", metavar="FILE",
                   help="write the plan's own slice per cell as records benchmarks.matrix_compare reads")
    a = p.parse_args()
    records = []
    dt = jnp.dtype(a.dtype)
    rng = np.random.default_rng(0)
    env = "JCC_CL_BWD_STEPS" if a.bwd else "JCC_CL_FWD_STEPS"
    print(f"# {jax.devices()[0].device_kind}, jax {jax.__version__}, {dt.name}, channels-last {'backward' if a.bwd else 'forward'}, "
          f"device us per call (median of {a.rounds} traces)")
    for shape in a.shapes.split(","):
        B, D, L = (int(v) for v in shape.split("x"))
        x = jnp.asarray(rng.standard_normal((B, L, D)), dt)
        g = jnp.asarray(rng.standard_normal((B, L, D)), dt)
        ids = np.repeat(np.arange(8), -(-L // 8))[:L]
        ids[-max(1, L // 20):] = -1
        sidx = {"dense": None, "seq": jnp.asarray(np.tile(ids, (B, 1)), jnp.int32)}
        for W in (int(v) for v in a.widths.split(",")):
            w = jnp.asarray(rng.standard_normal((D, W)) / W, dt)
            bias = jnp.asarray(rng.standard_normal((D,)), dt)
            base = 128 if a.bwd else base_steps(W)
            for mode in a.modes.split(","):
                s = sidx[mode]
                def at(steps):
                    # (a program per setting: one replayed from a CUDA graph
                    # keeps the launch recorded at capture)
                    def fwd(x, w, b):
                        return jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=s,
                                                 channels_last=True, backend="ffi")

                    # the backward alone: y unused, XLA drops the forward (g an
                    # argument: a captured array would be compiled in as a constant)
                    f = jax.jit(lambda x, w, b, g: jax.vjp(fwd, x, w, b)[1](g)) if a.bwd else jax.jit(fwd)

                    def run(*args):
                        if steps is None:
                            os.environ.pop(env, None)
                        else:
                            os.environ[env] = str(steps)
                        return f(*args)
                    return run

                keys = [base, 2 * base, None] if a.bwd else [base // 2, base, 2 * base, None]
                if a.auto_only:
                    keys = [None]
                args = (x, w, bias, g) if a.bwd else (x, w, bias)
                programs = {k: (at(k), args, 1) for k in keys}
                for k in keys:
                    jax.block_until_ready(programs[k][0](*args))
                ref = programs[None][0](*args)
                for k in keys[:-1]:  # every slice computes the same y (and dx)
                    got = programs[k][0](*args)
                    if not bool(jnp.array_equal(got[0] if a.bwd else got, ref[0] if a.bwd else ref)):
                        print(f"MISMATCH ({B},{D},{L}) W={W} {mode} steps {k}")
                runs = [device_times(programs, n=10) for _ in range(a.rounds)]
                os.environ.pop(env, None)
                med = {k: statistics.median(r[k] for r in runs) for k in keys}
                best = min(keys[:-1], key=lambda k: med[k]) if len(keys) > 1 else None
                cells = "  ".join(f"{k:4d}: {med[k]:8.1f}" for k in keys[:-1])
                print(f"({B},{D},{L}) W={W:2d} {mode:5s} | {cells}  auto: {med[None]:8.1f} | best {best}",
                      flush=True)
                records.append({"key": {"B": B, "D": D, "L": L, "dtype": dt.name, "layout": "cl",
                                        "mode": mode, "W": W},
                                "times": {"ours": {"bwd" if a.bwd else "fwd": {"dev_us": med[None]}}}})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"records": records}, f)


if __name__ == "__main__":
    main()
