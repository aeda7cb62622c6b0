"""Packed sequences (varlen), prefill states and the decode update."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_causal_conv as jcc
from jax_causal_conv import reference

import oracle
from helpers import DTYPES, close, rand, to_np

SPLITS = [[0, 5, 6, 6, 30], [0, 1], [0, 40], [0, 0, 3, 3, 17, 18]]


@pytest.mark.parametrize("cu", SPLITS)
@pytest.mark.parametrize("W", [1, 2, 4, 6])
@pytest.mark.parametrize("states", [False, True])
def test_varlen_equals_per_sequence_calls(cu, W, states):
    rng = np.random.default_rng(len(cu) * 10 + W)
    T, D, N = cu[-1], 9, len(cu) - 1
    x, w, b = rand(rng, (T, D)), rand(rng, (D, W)), rand(rng, (D,))
    h = rand(rng, (N, D, W - 1)) if states else None
    cu_a = jnp.asarray(cu, jnp.int32)
    y, f = jcc.causal_conv1d_varlen(x, w, b, cu_seqlens=cu_a, activation="silu",
                                    initial_states=h, return_final_states=True, backend="ffi")
    yo, fo = oracle.varlen(to_np(x), to_np(w), to_np(b), cu, "silu", to_np(h))
    close(y, yo, jnp.float32, 10)
    close(f, fo, jnp.float32)
    yr, fr = reference.causal_conv1d_varlen(x, w, b, cu_seqlens=cu_a, activation="silu",
                                            initial_states=h, return_final_states=True)
    close(y, yr, jnp.float32)
    close(f, fr, jnp.float32)
    for n in range(N):  # each sequence alone through causal_conv1d
        s, e = cu[n], cu[n + 1]
        yn, fn = jcc.causal_conv1d(x[s:e].T[None], w, b, activation="silu",
                                   initial_states=None if h is None else h[n:n + 1],
                                   return_final_states=True)
        close(y[s:e], yn[0].T, jnp.float32)
        close(f[n], fn[0], jnp.float32)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_varlen_dtypes(dtype):
    rng = np.random.default_rng(1)
    cu = [0, 7, 20, 21]
    x, w = rand(rng, (21, 16), DTYPES[dtype]), rand(rng, (16, 4))
    y = jcc.causal_conv1d_varlen(x, w, cu_seqlens=jnp.asarray(cu, jnp.int32))
    assert y.dtype == x.dtype
    yo, _ = oracle.varlen(to_np(x), to_np(w), None, cu)
    close(y, yo, x.dtype, 10)


def test_varlen_gradients_float64():
    rng = np.random.default_rng(4)
    cu = jnp.asarray([0, 2, 9, 13], jnp.int32)
    x, w, b, h = (rand(rng, s, jnp.float64) for s in [(13, 3), (3, 4), (3,), (3, 3, 3)])
    g, gf = rand(rng, (13, 3), jnp.float64), rand(rng, (3, 3, 3), jnp.float64)

    def f(x, w, b, h):
        y, fin = jcc.causal_conv1d_varlen(x, w, b, cu_seqlens=cu, activation="silu",
                                          initial_states=h, return_final_states=True)
        return jnp.sum(y * g) + jnp.sum(fin * gf)
    check_grads(f, (x, w, b, h), order=1, modes=("rev",))


@pytest.mark.parametrize("cu", SPLITS)
@pytest.mark.parametrize("state_len", [0, 1, 3, 8])
def test_varlen_states(cu, state_len):
    rng = np.random.default_rng(state_len)
    x = rand(rng, (cu[-1], 5))
    got = jcc.causal_conv1d_varlen_states(x, jnp.asarray(cu, jnp.int32), state_len)
    assert got.shape == (len(cu) - 1, 5, state_len)
    np.testing.assert_array_equal(np.asarray(got, np.float64),
                                  oracle.varlen_states(to_np(x), cu, state_len))


# --- decode ------------------------------------------------------------------

def _full(x, w, b, act):
    return jcc.causal_conv1d(x, w, b, activation=act, backend="xla")


@pytest.mark.parametrize("W,state_len", [(4, 3), (4, 7), (1, 0), (2, 1), (5, 4)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_token_by_token_equals_full(W, state_len, dtype):
    rng = np.random.default_rng(W + state_len)
    B, D, L = 3, 10, 17
    x, w, b = rand(rng, (B, D, L), DTYPES[dtype]), rand(rng, (D, W)), rand(rng, (D,))
    want = _full(x, w, b, "silu")
    state = jnp.zeros((B, D, state_len), x.dtype)
    step = jax.jit(lambda xt, st: jcc.causal_conv1d_update(xt, st, w, b, activation="silu"),
                   donate_argnums=1)
    ys = []
    for t in range(L):
        y, state = step(x[:, :, t], state)
        ys.append(y)
    close(jnp.stack(ys, -1), want, x.dtype)
    if state_len:  # the state holds the newest inputs
        take = min(state_len, L)
        np.testing.assert_array_equal(state[..., state_len - take:], x[..., L - take:])


@pytest.mark.parametrize("chunks", [[5, 1, 11], [17], [2, 2, 2, 11]])
def test_multi_token_updates_equal_full(chunks):
    rng = np.random.default_rng(len(chunks))
    B, D, W = 2, 6, 4
    x, w = rand(rng, (B, D, sum(chunks))), rand(rng, (D, W))
    state = jnp.zeros((B, D, 5))
    ys, t = [], 0
    for c in chunks:
        y, state = jcc.causal_conv1d_update(x[:, :, t:t + c], state, w)
        ys.append(y)
        t += c
    close(jnp.concatenate(ys, -1), _full(x, w, None, None), jnp.float32)


@pytest.mark.parametrize("state_len", [3, 5, 8])
def test_circular_buffer_with_cache_seqlens(state_len):
    """Rows start at different offsets; the circular state gives the full result."""
    rng = np.random.default_rng(state_len)
    B, D, W, L = 3, 4, 4, 14
    x, w = rand(rng, (B, D, L)), rand(rng, (D, W))
    want = _full(x, w, None, "silu")
    state = jnp.zeros((B, D, state_len))
    seqlens = jnp.zeros((B,), jnp.int32)
    ys, t = [], 0
    for c in [1, 3, 1, 5, 4]:
        y, state = jcc.causal_conv1d_update(x[:, :, t:t + c], state, w, activation="silu",
                                            cache_seqlens=seqlens)
        ys.append(y)
        seqlens = seqlens + c
        t += c
    close(jnp.concatenate(ys, -1), want, jnp.float32)


def test_update_matches_reference_with_indices_and_padding():
    rng = np.random.default_rng(0)
    B, D, W, N, SL = 4, 8, 4, 6, 5
    x, w, b = rand(rng, (B, D, 2)), rand(rng, (D, W)), rand(rng, (D,))
    state = rand(rng, (N, D, SL))
    idx = jnp.asarray([5, -1, 0, 2], jnp.int32)
    seqlens = jnp.asarray([3, 9, 0, 12], jnp.int32)
    for kw in [dict(conv_state_indices=idx), dict(conv_state_indices=idx, cache_seqlens=seqlens)]:
        y, new = jcc.causal_conv1d_update(x, state, w, b, activation="silu", **kw)
        yr, newr = reference.causal_conv1d_update(x, state, w, b, activation="silu", **kw)
        close(y, yr, jnp.float32)
        close(new, newr, jnp.float32)
        assert not np.asarray(y[1]).any()  # padding row: zeros
        untouched = [1, 3, 4]              # slots nobody points at keep their values
        np.testing.assert_array_equal(new[jnp.asarray(untouched)], state[jnp.asarray(untouched)])


def test_slots_continue_sequences_across_calls():
    """Continuous batching: two sequences in slots 2 and 0 advanced in a shuffled batch."""
    rng = np.random.default_rng(9)
    D, W = 5, 3
    w = rand(rng, (D, W))
    seqs = [rand(rng, (D, 6)), rand(rng, (D, 6))]
    state = jnp.zeros((3, D, W - 1))
    outs = [[], []]
    for t in range(6):
        order = [1, 0] if t % 2 else [0, 1]
        slots = jnp.asarray([[2, 0][i] for i in order] + [-1], jnp.int32)
        xt = jnp.stack([seqs[i][:, t] for i in order] + [jnp.ones(D)])
        y, state = jcc.causal_conv1d_update(xt, state, w, conv_state_indices=slots)
        for row, i in enumerate(order):
            outs[i].append(y[row])
    for i in range(2):
        close(jnp.stack(outs[i], -1), _full(seqs[i][None], w, None, None)[0], jnp.float32)


@pytest.mark.on_cpu  # (float64: the CPU's custom call)
def test_update_is_in_place_when_donated():
    B, D, W = 2, 16, 4
    w = jnp.ones((D, W))
    step = jax.jit(lambda x, s: jcc.causal_conv1d_update(x, s, w), donate_argnums=1)
    state = jnp.zeros((B, D, W - 1))
    hlo = step.lower(jnp.ones((B, D)), state).compile().as_text()
    from jax_causal_conv._lowering import targets
    assert targets.UPDATE in hlo
    # the state parameter is aliased to the output: no copy of the state
    assert "input_output_alias" in hlo
    ptr = state.unsafe_buffer_pointer()
    _, new = step(jnp.ones((B, D)), state)
    assert new.unsafe_buffer_pointer() == ptr
