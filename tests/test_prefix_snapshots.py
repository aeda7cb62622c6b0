"""Prefix-cache snapshots: causal_conv1d_varlen(..., block_size, max_blocks) and
jax_causal_conv.prefix.causal_conv1d_varlen_block_states, against the final
states of the convolution run on each prefix alone (the kernel and the numpy
oracle), with and without initial states, under jit, and in a chunked prefill
that fills a prefix cache and then restarts a request from a cached block."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import jax_causal_conv as jcc
from jax_causal_conv.prefix import causal_conv1d_varlen_block_states

import oracle
from helpers import close, rand, to_np


def _prefix_state(x_seq, init, e, W):
    """The numpy oracle's final state after the first e tokens, (D, W-1)."""
    _, fin = oracle.conv(np.asarray(x_seq[:e], np.float64).T[None], np.ones((x_seq.shape[1], W)),
                         init=None if init is None else to_np(init)[None])
    return fin[0]


SPLITS = [[0, 5, 6, 6, 30], [0, 17], [0, 0, 3, 3, 24, 25, 41]]


@pytest.mark.parametrize("cu", SPLITS)
@pytest.mark.parametrize("W", [1, 2, 4, 6])
@pytest.mark.parametrize("K", [1, 3, 4, 8])
@pytest.mark.parametrize("states", [False, True])
def test_snapshots_equal_the_final_states_of_each_prefix(cu, W, K, states):
    rng = np.random.default_rng(len(cu) * 100 + W * 10 + K)
    T, D, N = cu[-1], 5, len(cu) - 1
    x, w, b = rand(rng, (T, D)), rand(rng, (D, W)), rand(rng, (D,))
    h = rand(rng, (N, D, W - 1)) if states else None
    M = 4  # some sequences have more boundaries: those are dropped
    cua = jnp.asarray(cu, jnp.int32)
    y, fin, snaps = jcc.causal_conv1d_varlen(x, w, b, cu_seqlens=cua, activation="silu",
                                             initial_states=h, return_final_states=True,
                                             block_size=K, max_blocks=M)
    assert snaps.shape == (N, M, D, W - 1) and snaps.dtype == x.dtype
    y0, fin0 = jcc.causal_conv1d_varlen(x, w, b, cu_seqlens=cua, activation="silu",
                                        initial_states=h, return_final_states=True)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(fin, fin0)
    for n in range(N):
        s, e = cu[n], cu[n + 1]
        for m in range(M):
            t = (m + 1) * K
            if t > e - s:  # past the sequence's end: zeros
                assert not np.asarray(snaps[n, m]).any(), (n, m)
                continue
            np.testing.assert_array_equal(np.asarray(snaps[n, m], np.float64),
                                          _prefix_state(x[s:e], None if h is None else h[n],
                                                        t, W))
            # the kernel's own final state of the prefix alone
            _, f = jcc.causal_conv1d_varlen(x[s:s + t], w, b, cu_seqlens=jnp.asarray([0, t]),
                                            initial_states=None if h is None else h[n:n + 1],
                                            return_final_states=True)
            np.testing.assert_array_equal(snaps[n, m], f[0])
    y2 = jcc.causal_conv1d_varlen(x, w, cu_seqlens=cua, block_size=K, max_blocks=M)
    assert isinstance(y2, tuple) and len(y2) == 2


def test_snapshots_under_jit_traced_offsets_and_xla_backend():
    rng = np.random.default_rng(1)
    D, W, K, M = 6, 4, 3, 5
    x, w = rand(rng, (20, D)), rand(rng, (D, W))
    h = rand(rng, (3, D, W - 1))
    cu = jnp.asarray([0, 4, 11, 20], jnp.int32)

    @jax.jit
    def f(x, cu, h):
        return jcc.causal_conv1d_varlen(x, w, cu_seqlens=cu, initial_states=h, block_size=K,
                                        max_blocks=M)

    y, snaps = f(x, cu, h)
    y_e, snaps_e = jcc.causal_conv1d_varlen(x, w, cu_seqlens=cu, initial_states=h,
                                            block_size=K, max_blocks=M, backend="xla")
    close(y, y_e, jnp.float32)
    np.testing.assert_array_equal(snaps, snaps_e)
    # other offsets, same compiled shapes
    cu2 = jnp.asarray([0, 9, 9, 20], jnp.int32)
    _, snaps2 = f(x, cu2, h)
    np.testing.assert_array_equal(snaps2[1], 0)
    np.testing.assert_array_equal(snaps2[0, 2], np.asarray(x[6:9]).T)


@pytest.mark.parametrize("channels_last", [False, True])
def test_block_states_start_positions_and_layouts(channels_last):
    """Chunks that start mid-block: boundaries fall at whole-sequence multiples of K."""
    rng = np.random.default_rng(2)
    D, H, K, M = 4, 3, 5, 4
    cu = [0, 7, 19, 30]
    x = rand(rng, (30, D))
    init = rand(rng, (3, D, H))
    start = np.asarray([3, 10, 0], np.int32)   # tokens each sequence had before
    got = causal_conv1d_varlen_block_states(
        x, jnp.asarray(cu, jnp.int32), H, block_size=K, max_blocks=M,
        initial_states=jnp.swapaxes(init, 1, 2) if channels_last else init,
        start_positions=jnp.asarray(start), channels_last=channels_last)
    assert got.shape == ((3, M, H, D) if channels_last else (3, M, D, H))
    if channels_last:
        got = jnp.swapaxes(got, 2, 3)
    for n in range(3):
        seq = np.asarray(x[cu[n]:cu[n + 1]], np.float64)
        ext = np.concatenate([np.asarray(init[n], np.float64).T, seq])     # (H + len, D)
        ends = [e for e in range(1, len(seq) + 1) if (start[n] + e) % K == 0][:M]
        for m in range(M):
            if m < len(ends):
                want = ext[ends[m]:ends[m] + H].T
                np.testing.assert_array_equal(np.asarray(got[n, m], np.float64), want)
            else:
                assert not np.asarray(got[n, m]).any()


def test_snapshots_gradients_float64():
    rng = np.random.default_rng(4)
    cu = jnp.asarray([0, 5, 13], jnp.int32)
    x, w, h = rand(rng, (13, 3), jnp.float64), rand(rng, (3, 4), jnp.float64), \
        rand(rng, (2, 3, 3), jnp.float64)
    c = rand(rng, (2, 3, 3, 3), jnp.float64)

    def f(x, h):
        y, snaps = jcc.causal_conv1d_varlen(x, w, cu_seqlens=cu, initial_states=h,
                                            block_size=2, max_blocks=3)
        return jnp.sum(y) + jnp.sum(snaps * c)
    check_grads(f, (x, h), order=1, modes=("rev",))


def test_chunked_prefill_fills_a_prefix_cache_and_a_hit_resumes_from_it():
    """Two requests prefilled in chunks (some not block-aligned, so the chunks
    pass start_positions); every chunk's snapshots go to a block table, which
    must equal the one-shot snapshots; a third request sharing request 0's
    first blocks starts from a cached block and gets the one-shot outputs."""
    rng = np.random.default_rng(5)
    D, W, K = 8, 4, 4
    lens = [37, 22]
    seqs = [rand(rng, (n, D)) for n in lens]
    w, b = rand(rng, (D, W)), rand(rng, (D,))
    nblk = max(lens) // K
    one_shot = [jcc.causal_conv1d_varlen(s, w, b, cu_seqlens=jnp.asarray([0, len(s)]),
                                         activation="silu", block_size=K, max_blocks=nblk)
                for s in seqs]
    table = np.zeros((2, nblk, D, W - 1), np.float32)
    state = jnp.zeros((2, D, W - 1))
    done = [0, 0]
    ys = [[], []]
    for chunk in [(8, 5), (3, 9), (12, 8), (14, 0)]:  # tokens per request per step
        xs = [seqs[i][done[i]:done[i] + chunk[i]] for i in range(2)]
        cu = jnp.asarray([0, len(xs[0]), len(xs[0]) + len(xs[1])], jnp.int32)
        x = jnp.concatenate(xs)
        y, fin = jcc.causal_conv1d_varlen(x, w, b, cu_seqlens=cu, activation="silu",
                                          initial_states=state, return_final_states=True)
        snaps = causal_conv1d_varlen_block_states(
            x, cu, W - 1, block_size=K, max_blocks=4, initial_states=state,
            start_positions=jnp.asarray(done, jnp.int32))
        for i in range(2):
            ys[i].append(y[int(cu[i]):int(cu[i + 1])])
            first = done[i] // K                      # absolute block of snapshot 0
            for m in range((done[i] + chunk[i]) // K - first):
                table[i, first + m] = snaps[i, m]
            done[i] += chunk[i]
        state = fin
    assert done == lens
    for i in range(2):
        close(jnp.concatenate(ys[i]), one_shot[i][0], jnp.float32)
        full_blocks = lens[i] // K
        np.testing.assert_array_equal(table[i, :full_blocks], one_shot[i][1][0, :full_blocks])
    # a prefix-cache hit: request 2 shares request 0's first 5 blocks (20 tokens)
    hit = 5
    tail = rand(rng, (9, D))
    req = jnp.concatenate([seqs[0][:hit * K], tail])
    want = jcc.causal_conv1d_varlen(req, w, b, cu_seqlens=jnp.asarray([0, len(req)]),
                                    activation="silu")
    y = jcc.causal_conv1d_varlen(tail, w, b, cu_seqlens=jnp.asarray([0, 9]), activation="silu",
                                 initial_states=jnp.asarray(table[0:1, hit - 1]))
    close(y, want[hit * K:], jnp.float32)


@pytest.mark.parametrize("kw,exc,words", [
    (dict(block_size=4), ValueError, ["block_size and max_blocks"]),
    (dict(max_blocks=4), ValueError, ["block_size and max_blocks"]),
    (dict(block_size=0, max_blocks=2), ValueError, ["block_size", ">= 1", "0"]),
    (dict(block_size=2, max_blocks=-1), ValueError, ["max_blocks", "-1"]),
    (dict(block_size=2.0, max_blocks=1), ValueError, ["block_size", "2.0"]),
])
def test_snapshot_argument_errors(kw, exc, words):
    x, w = jnp.ones((6, 3)), jnp.ones((3, 4))
    with pytest.raises(exc) as e:
        jcc.causal_conv1d_varlen(x, w, cu_seqlens=jnp.asarray([0, 6], jnp.int32), **kw)
    for word in words:
        assert word in str(e.value), (word, str(e.value))
    with pytest.raises(ValueError, match="start_positions"):
        causal_conv1d_varlen_block_states(x, jnp.asarray([0, 6], jnp.int32), 3, block_size=2,
                                          max_blocks=1, start_positions=jnp.zeros((2,), jnp.int32))
    with pytest.raises(ValueError, match="initial_states"):
        causal_conv1d_varlen_block_states(x, jnp.asarray([0, 6], jnp.int32), 3, block_size=2,
                                          max_blocks=1, initial_states=jnp.ones((1, 4, 3)))
