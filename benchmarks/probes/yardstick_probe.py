"""The decode step's device time per layer: ours against two yardsticks, the
benchmark's (one XLA pass per layer negating a (B, D, W) donated array: the
bytes an update reads and writes) and the one used before 2026-11-23, which
negated x and each (B, D, W-1) state: XLA folds the 32 negations of the x
chain into one kernel, so that one moved 3/4 of the bytes per layer.
    python3 tools/yardstick_probe.py [all | b64]"""
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench import decode_stepper, device_busy_us, device_events
from benchmarks.probes.trace_probe import summarize

rng = np.random.default_rng(0)
dt, W, L = jnp.bfloat16, 4, 32
which = sys.argv[1:] or ["all"]
for B, D in ((64, 4096), (256, 8192)):
    if "b64" in which and B != 64: continue
    ws = [jnp.asarray(rng.standard_normal((D, W)) / 2, dt) for _ in range(L)]
    bs = [jnp.asarray(rng.standard_normal((D,)), dt) for _ in range(L)]
    x = jnp.asarray(rng.standard_normal((B, D)), dt)

    def old_yard(states):
        @functools.partial(jax.jit, donate_argnums=(0,))
        def step(states, x):
            new = []
            for l in range(L):
                x, s = -x, -states[l]
                new.append(s)
            return new, x
        box = [states]
        def run(x, ws, bs):
            box[0], y = step(box[0], x)
            return y
        return run
    cases = [("ours", lambda: decode_stepper(L, "ffi", [jnp.asarray(rng.standard_normal((B, D, W - 1)), dt) for _ in range(L)]))]
    if "all" in which:
        cases += [("old yardstick", lambda: old_yard([jnp.asarray(rng.standard_normal((B, D, W - 1)), dt) for _ in range(L)])),
                  ("new yardstick", lambda: decode_stepper(L, "negate", [jnp.asarray(rng.standard_normal((B, D, W)), dt) for _ in range(L)]))]
    for name, mk in cases:
        run = mk()
        for _ in range(3): run(x, ws, bs)
        vals = [device_busy_us(run, x, ws, bs) / L for _ in range(3)]
        print(f"B={B} D={D} {name} [{os.environ.get('JCC_EXP_NOSTAGE') and 'nostage' or 'default'}]: "
              f"device us/layer {' '.join(f'{v:.3f}' for v in vals)}", flush=True)
        if "all" in which:
            summarize(f"B={B} {name}", device_events(run, x, ws, bs, n=10), 10)
