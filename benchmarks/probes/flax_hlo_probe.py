"""Probe: the compiled HLO of a Flax linen ring decode step beside the raw
update with the same counters ("commit" form), a few layers, for reading
which small ops XLA adds around the update calls (any platform).

    PYTHONPATH=src:. python3 -m benchmarks.probes.flax_hlo_probe OUTDIR
"""
import sys

if __name__ == "__main__" and {"-h", "--help"} & set(sys.argv[1:]):
    print(__doc__)  # the purpose and the command line; nothing runs
    sys.exit(0)

import collections
import re

import jax
import jax.numpy as jnp

from . import flax_speculative_probe as P


def ops(text):
    entry = text[text.index("ENTRY"):]
    kinds = collections.Counter()
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%\S+ = \S+(?:\{[^}]*\})? ([\w-]+)\(", line)
        if m and m.group(1) not in ("parameter", "bitcast", "get-tuple-element", "tuple", "constant"):
            kinds[m.group(1)] += 1
    return dict(kinds)


def main():
    out = sys.argv[1]
    P.LAYERS = 4
    B, D, dt = 64, 4096, jnp.bfloat16
    progs = {"linen_K3": P.linen_runner(B, D, P.K, dt, f"{out}/linen_K3.txt"),
             "linen_K0": P.linen_runner(B, D, 0, dt, f"{out}/linen_K0.txt")}
    raw = P.raw_runner(B, D, True, "commit", dt, True)
    tok = jnp.ones((B, D), dt)
    jax.block_until_ready(raw(tok))
    for name in progs:
        print(name, ops(open(f"{out}/{name}.txt").read()))
    for f in raw.__closure__ or ():
        step = f.cell_contents
        if hasattr(step, "lower"):
            box = next(c.cell_contents for c in raw.__closure__ if isinstance(c.cell_contents, list))
            text = step.lower(box[0], box[1], box[2], tok).compile().as_text()
            open(f"{out}/raw_commit.txt", "w").write(text)
            print("raw_commit", ops(text))


if __name__ == "__main__":
    main()
