"""The XLA twin's backward (xla_twins.backward: what TPU / ROCm, float64
on a GPU and backend="auto"'s XLA routes run), through its own convention
(weight groups, both layouts, states, padding, W - 1 > L): equal to the
autodiff of the reference group by group and to central differences of
the numpy oracle's loss, in float64 on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oracle
from helpers import on_cpu, swap_layout
from jax_causal_conv import reference
from jax_causal_conv._lowering import xla_twins
from jax_causal_conv._lowering.config import ROWS, SEQ_IDX, ConvConfig, split_groups


def _case(rng, G, n, D, L, W, cl, mode, states, dtype=np.float64):
    B = G * n
    xs = (B, L, D) if cl else (B, D, L)
    hs = (B, W - 1, D) if cl else (B, D, W - 1)
    x = rng.standard_normal(xs)
    w = rng.standard_normal((G, D, W)) / np.sqrt(W)
    b = rng.standard_normal((G, D))
    dy = rng.standard_normal(xs)
    seq = None
    if mode == SEQ_IDX:
        seq = np.sort(rng.integers(0, 3, (B, L)), axis=1).astype(np.int32)
        seq[:, L // 2: L // 2 + 2] = -1  # padding inside a row (ids then resume)
        seq[:, L // 2 + 2:] += 5
        seq[0, -3:] = -1  # and a padded tail
    init = rng.standard_normal(hs) if states else None
    dfin = rng.standard_normal(hs) if states else None
    as_j = lambda a: None if a is None else jnp.asarray(a, dtype if a.dtype != np.int32 else jnp.int32)
    return [as_j(a) for a in (x, w, b, seq, init, dy, dfin)]


def _twin(act, cl, x, w, b, seq, init, dy, dfin):
    cfg = ConvConfig(activation=act, mode=ROWS if seq is None else SEQ_IDX, channels_last=cl, states_channels_last=cl,
                     want_final=dfin is not None, backend="auto")
    return xla_twins.backward(cfg, x, w, b, seq, None, init, dy, dfin)


def _autodiff(act, cl, x, w, b, seq, init, dy, dfin):
    """jax.vjp of the reference, one weight group at a time (the twin vmaps it)."""
    G = w.shape[0]
    outs = []
    for g in range(G):
        sl = lambda a: None if a is None else split_groups(a, G)[g]  # noqa: E731
        f = lambda x, w, b, h: reference.causal_conv1d(  # noqa: E731
            x, w, b, activation=act, seq_idx=sl(seq), initial_states=h,
            return_final_states=dfin is not None, channels_last=cl)
        _, vjp = jax.vjp(f, sl(x), w[g], b[g], sl(init))
        outs.append(vjp((sl(dy), sl(dfin)) if dfin is not None else sl(dy)))
    dx, dw, db, dh = zip(*outs)
    return (jnp.concatenate(dx), jnp.stack(dw), jnp.stack(db),
            None if dh[0] is None else jnp.concatenate(dh))


def _oracle_loss(act, cl, x, w, b, seq, init, dy, dfin):
    """sum(y dy) + sum(final dfin) from the numpy loops, group by group."""
    G = w.shape[0]
    n = x.shape[0] // G
    total = 0.0
    for g in range(G):
        r = slice(g * n, (g + 1) * n)
        y, fin = oracle.conv(swap_layout(x[r], cl), w[g], b[g], act, None,
                             None if seq is None else np.asarray(seq[r]),
                             None if init is None else swap_layout(init[r], cl))
        total += np.sum(y * swap_layout(dy[r], cl))
        if dfin is not None:
            total += np.sum(fin * swap_layout(dfin[r], cl))
    return total


@pytest.mark.parametrize("W,L", [(1, 9), (3, 17), (5, 3), (6, 23)])
@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("mode,states", [(ROWS, False), (ROWS, True), (SEQ_IDX, False), (SEQ_IDX, True)])
@pytest.mark.parametrize("act", [None, "silu"])
def test_twin_backward_matches_autodiff_and_oracle(W, L, cl, mode, states, act):
    rng = np.random.default_rng(W * 100 + L + 7 * cl + 3 * mode + states)
    with on_cpu(), jax.enable_x64(True):
        a = _case(rng, 2, 2, 3, L, W, cl, mode, states)
        got = _twin(act, cl, *a)
        want = _autodiff(act, cl, *a)
        assert len(got) == 4
        for g, e in zip(got, want):
            assert (g is None) == (e is None)
            if e is not None:
                assert g.shape == e.shape and g.dtype == e.dtype
                np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-11, atol=1e-11)
        # directional derivatives of the oracle's loss (central differences)
        x, w, b, seq, init, dy, dfin = (None if v is None else np.asarray(v) for v in a)
        prim = [x, w, b, init]
        eps = 1e-6
        for i, (p, gr) in enumerate(zip(prim, got)):
            if p is None or p.size == 0:
                continue
            v = rng.standard_normal(p.shape)
            hi, lo = list(prim), list(prim)
            hi[i], lo[i] = p + eps * v, p - eps * v
            num = (_oracle_loss(act, cl, hi[0], hi[1], hi[2], seq, hi[3], dy, dfin)
                   - _oracle_loss(act, cl, lo[0], lo[1], lo[2], seq, lo[3], dy, dfin)) / (2 * eps)
            np.testing.assert_allclose(float(np.sum(np.asarray(gr) * v)), num, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cl", [False, True])
def test_twin_backward_low_precision_dtypes(cl):
    """bfloat16 x with float32 weights: the gradients take their inputs'
    dtypes and agree with the autodiff to the dtype's rounding."""
    rng = np.random.default_rng(5)
    with on_cpu():
        a = _case(rng, 1, 2, 8, 40, 4, cl, SEQ_IDX, True, dtype=jnp.bfloat16)
        a[1], a[2] = a[1].astype(jnp.float32), a[2].astype(jnp.float32)
        got = _twin("silu", cl, *a)
        want = _autodiff("silu", cl, *a)
        for g, e in zip(got, want):
            assert g.dtype == e.dtype
            np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(e, np.float32), rtol=3e-2, atol=3e-2)
