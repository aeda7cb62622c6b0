"""Helpers of the sharding tests: meshes over the 8 virtual CPU devices
(conftest.py), the collectives of compiled HLO, and a float64 numpy oracle
of SPEC.md's seq_idx semantics (padding, initial and final states), written
from the SPEC and sharing no code with the package."""

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

def _silu(v):
    return v / (1.0 + np.exp(-v))


def conv_seq_idx(x, w, b, seq_idx, init=None, act=None, residual=None):
    """SPEC.md's causal_conv1d with seq_idx, (B, D, L) -> (y, final_states)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    s = np.asarray(seq_idx)
    B, D, L = x.shape
    H = w.shape[1] - 1
    xp = np.zeros((B, D, H + L))
    if init is not None:
        xp[:, :, :H] = np.asarray(init, np.float64)
    xp[:, :, H:] = x

    def sid(bi, p):  # id of position p (history: the row's first id, if initial states)
        if p >= 0:
            return s[bi, p]
        return s[bi, 0] if init is not None else None

    y = np.zeros((B, D, L))
    fin = np.zeros((B, D, H))
    for bi in range(B):
        for t in range(L):
            if s[bi, t] < 0:
                continue
            acc = np.zeros(D) if b is None else np.asarray(b, np.float64).copy()
            for k in range(H + 1):
                p = t - H + k
                if sid(bi, p) == s[bi, t]:
                    acc += w[:, k] * xp[bi, :, p + H]
            y[bi, :, t] = _silu(acc) if act == "silu" else acc
        valid = np.nonzero(s[bi] >= 0)[0]
        if not len(valid):
            fin[bi] = xp[bi, :, :H]
            continue
        e = valid[-1] + 1
        for j in range(H):
            p = e - H + j
            if sid(bi, p) == s[bi, e - 1]:
                fin[bi, :, j] = xp[bi, :, p + H]
    if residual is not None:
        y += np.asarray(residual, np.float64)
    return y, fin
