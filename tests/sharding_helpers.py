"""Helpers of the sharding tests: meshes over the 8 virtual CPU devices
(conftest.py) and the collectives of compiled HLO. (The float64 oracle of
the semantics is tests/oracle.py.)"""

import os
import re

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding

# JCC_SHARDING_PLATFORM=gpu runs the cases on the local GPUs (those whose mesh fits).
PLATFORM = os.environ.get("JCC_SHARDING_PLATFORM", "cpu")


def devices():
    try:
        return jax.devices(PLATFORM)
    except RuntimeError:
        return []


def mesh(shape, names, explicit=False):
    n = int(np.prod(shape))
    if len(devices()) < n:
        pytest.skip(f"needs {n} {PLATFORM} devices (conftest.py asks XLA for 8 CPU ones)")
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return Mesh(np.array(devices()[:n]).reshape(shape), names, axis_types=(kind,) * len(shape))


def put(a, m, spec):
    return None if a is None else jax.device_put(a, NamedSharding(m, spec))


# --- collectives in compiled HLO --------------------------------------------------

COLL = re.compile(r"= (.+?) (all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter"
                  r"|collective-broadcast)(?:-start)?\((.*)$")
SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


def collectives(hlo):
    """[(kind, [(dtype, shape), ...], attrs)] for every collective of compiled
    HLO with its result shapes (a GPU collective-permute-start's tuple starts
    with its operand, the same shape)."""
    out = []
    for line in hlo.splitlines():
        m = COLL.search(line)
        if m:
            shapes = [(d, tuple(int(v) for v in s.split(",") if v))
                      for d, s in SHAPE.findall(m.group(1))]
            if m.group(2) == "collective-permute" and len(shapes) > 1:
                shapes = shapes[:1]
            out.append((m.group(2), shapes, m.group(3)))
    return out


def pairs(attrs):
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
    return {tuple(int(v) for v in p.split(",")) for p in re.findall(r"\{(\d+,\d+)", m.group(0))}


def no_gathers(colls):
    bad = [c for c in colls if c[0] not in ("collective-permute", "all-reduce")]
    assert not bad, bad


def compiled(f, *args, **jit_kw):
    """(compiled executable, its HLO text): run and inspect the same compilation."""
    c = jax.jit(f, **jit_kw).lower(*args).compile()
    return c, c.as_text()


def close(a, b, tol, what=""):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (what, a.shape, b.shape)
    err = np.max(np.abs(a - b), initial=0.0)
    assert err <= tol * (1 + np.max(np.abs(b), initial=0.0)), (what, err)


# --- SPEC oracle for seq_idx -------------------------------------------------------

