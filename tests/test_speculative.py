"""Speculative decoding comes from the ring (SPEC.md): with state_len >= W-1+S,
verify S draft tokens in one causal_conv1d_update, advance cache_seqlens by
the a <= S accepted; random accept/reject schedules give exactly the outputs
and states of feeding only the accepted tokens, in both state layouts."""

import jax.numpy as jnp
import numpy as np
import pytest

import jax_causal_conv as jcc

import oracle_decode
import spec_schedule
from helpers import close


def _check(out, W, exact=True):
    B = len(out["spec"])
    for r in range(B):
        n = out["accepted"][r]
        assert out["spec"][r].shape == (n, out["streams"].shape[2])
        if exact:  # the same kernel on the same windows: bitwise equal
            np.testing.assert_array_equal(out["spec"][r], out["base"][r])
            np.testing.assert_array_equal(out["spec_window"][r], out["base_window"][r])
        else:
            close(out["spec"][r], out["base"][r], jnp.float32)
            close(out["spec_window"][r], out["base_window"][r], jnp.float32)
        # and both are the plain convolution of the accepted stream
        want = oracle_decode.stream(out["streams"][r, :n].T, out["w"], out["b"], "silu").T
        close(out["spec"][r], want, jnp.float32, 5)
        hist = np.concatenate([np.zeros((W - 1, want.shape[1])), out["streams"][r, :n]])
        close(out["spec_window"][r], hist[len(hist) - (W - 1):], jnp.float32)
    rows = slice(0, B)
    if exact:
        np.testing.assert_array_equal(out["next_spec"][rows], out["next_base"][rows])
    else:
        close(out["next_spec"][rows], out["next_base"][rows], jnp.float32)
    if out["pad_out"] is not None:
        assert not out["pad_out"].any() and not out["next_spec"][B:].any()


@pytest.mark.parametrize("cl", [False, True], ids=["channels_first", "channels_last"])
@pytest.mark.parametrize("W,S,extra", [(4, 1, 0), (4, 3, 0), (4, 5, 2), (2, 4, 0), (5, 2, 0),
                                       (1, 3, 0)])
@pytest.mark.parametrize("slots", [False, True])
def test_random_accept_schedules_equal_feeding_only_accepted(cl, W, S, extra, slots):
    rng = np.random.default_rng(100 * W + 10 * S + extra + slots)
    out = spec_schedule.run(rng, B=3, D=8, W=W, S=S, SL=W - 1 + S + extra, steps=7, cl=cl,
                            slots=slots)
    assert out["accepted"].sum() > 0
    _check(out, W)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float64"])
def test_speculative_dtypes(dtype):
    rng = np.random.default_rng(7)
    out = spec_schedule.run(rng, B=2, D=16, W=4, S=3, SL=6, steps=5, cl=True,
                            dtype=getattr(jnp, dtype))
    for r in range(2):  # bitwise against the accepted-only run in every dtype
        np.testing.assert_array_equal(out["spec"][r], out["base"][r])
        np.testing.assert_array_equal(out["spec_window"][r], out["base_window"][r])
    np.testing.assert_array_equal(out["next_spec"], out["next_base"])


@pytest.mark.parametrize("cl", [False, True])
def test_ring_one_short_of_w_minus_1_plus_s_loses_history(cl):
    """state_len = W-2+S is not enough: rejecting all S drafts after they were
    written overwrites the oldest entry the next step reads (the bound is tight)."""
    W, S, D = 4, 3, 4
    SL = W - 2 + S
    w = jnp.ones((D, W))
    hist = jnp.arange(1.0, 1 + (W - 1) * D).reshape(1, W - 1, D)  # 3 tokens, seen = 3
    st = jnp.zeros((1, SL, D)).at[:, :W - 1].set(hist)
    if not cl:
        st = jnp.swapaxes(st, 1, 2)
    seen = jnp.asarray([W - 1], jnp.int32)
    drafts = -jnp.ones((1, S, D) if cl else (1, D, S))
    _, st = jcc.causal_conv1d_update(drafts, st, w, cache_seqlens=seen, channels_last=cl)
    got = spec_schedule.window(st, 0, W - 1, W, cl)    # all rejected: seen unchanged
    assert not np.array_equal(got, np.asarray(hist[0], np.float64))
    # one more entry of ring keeps it
    st = jnp.zeros((1, SL + 1, D)).at[:, :W - 1].set(hist)
    if not cl:
        st = jnp.swapaxes(st, 1, 2)
    _, st = jcc.causal_conv1d_update(drafts, st, w, cache_seqlens=seen, channels_last=cl)
    np.testing.assert_array_equal(spec_schedule.window(st, 0, W - 1, W, cl),
                                  np.asarray(hist[0], np.float64))


def test_xla_backend_follows_the_same_schedule():
    rng = np.random.default_rng(3)
    out = spec_schedule.run(rng, B=2, D=6, W=4, S=4, SL=7, steps=6, cl=True, slots=True,
                            backend="xla")
    _check(out, 4, exact=False)
