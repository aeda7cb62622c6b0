"""Channels-first seq_idx in the streaming family at every W <= 16, each
compiled at its own width (the kernels that share each chunk's id masks among
8 channels, cuda/stream_ids.cuh),
every width and dtype, GPU against the CPU kernels: rows of whole 16-byte
vectors, channel counts that leave a partial group of 8 and a partial block, several
chunks and a partial one, one-token segments across a chunk edge, padding in
the middle and at the tail, ids that return, initial and final states, a
vmapped weight, and non-finite inputs kept inside their own sequence.
The same ids run through the channels-last row kernels (cuda/cl_row.cuh:
groups of steps inside one sequence take the unmasked steps, the others
the masked ones) at channel counts of whole aligned vectors."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_causal_conv as jcc

from gpu_support import CPU, GPU, MARKS, check, grads, inputs, run, same_entries

pytestmark = MARKS


def packed_ids(rng, B, L):
    ids = np.zeros((B, L), np.int32)
    for r in range(B):
        cuts = np.sort(rng.choice(np.arange(1, L), 6, replace=False))
        ids[r] = np.searchsorted(cuts, np.arange(L), side="right")
    if L > 1030:
        ids[0, 1018:1030] = np.arange(50, 62)  # one-token segments across the bf16 chunk edge
    ids[-1, 508:516] = np.arange(70, 78)       # and the float32 one
    ids[:, L // 3: L // 3 + 9] = -1          # padding in the middle
    ids[0, L // 2: L // 2 + 4] = ids[0, 0]   # an id that returns
    ids[:, -13:] = -1                        # a padded tail
    return jnp.asarray(ids)


SHAPES = {False: [(2, 20, 2056), (1, 33, 1104), (3, 16, 520)],
          True: [(2, 64, 2056), (1, 40, 1104), (3, 16, 520)]}


def with_steps(x, cl, values):
    """x with every channel of the given time steps set ({step: value})."""
    xn = np.array(x.astype(jnp.float32))
    xt = np.swapaxes(xn, 1, 2) if cl else xn  # (a view, time last)
    for t, v in values.items():
        xt[:, :, t] = v
    return jnp.asarray(xn, x.dtype)


def seq_grads_vs_cpu(x, w, b, sidx, cl, dtype):
    """y and the grads of x, w, b with seq_idx on the GPU against the CPU
    (same_entries). Returns the GPU's (y, dx) with time last."""
    f = grads(lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx,
                                                channels_last=cl, backend="ffi"), (0, 1, 2))
    got = run(GPU, f, x, w, b)
    same_entries(got, run(CPU, f, x, w, b), dtype)
    y, (dx, _, _) = got
    return (np.swapaxes(y, 1, 2), np.swapaxes(dx, 1, 2)) if cl else (y, dx)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("W", [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15, 16])
@pytest.mark.parametrize("cl", [False, True])
def test_stream_seq_idx(dtype, W, cl):
    rng = np.random.default_rng(W)
    for (B, D, L) in SHAPES[cl]:
        x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
        res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
        sidx = packed_ids(rng, B, L)

        def f(x, w, b, r, h):
            y1, s1 = jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, initial_states=h,
                                       return_final_states=True, residual=r, channels_last=cl,
                                       backend="ffi")
            # no activation, no states
            y2 = jcc.causal_conv1d(x, w, b, seq_idx=sidx, channels_last=cl, backend="ffi")
            return y1, s1, y2

        check(grads(f, (0, 1, 2, 3, 4)), (x, w, b, res, init), dtype, f"stream seq_idx {B,D,L} cl={cl}")
    wv = jnp.stack([w, w[:, ::-1]])  # a vmapped weight: groups = 2
    fv = jax.vmap(lambda x, w: jcc.causal_conv1d(x[None], w, b, activation="silu", seq_idx=sidx[:1],
                                                 channels_last=cl, backend="ffi")[0])
    check(grads(fv, (0, 1)), (x[:2], wv), dtype, "stream seq_idx groups")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("W", [2, 4, 8, 10, 12, 14, 16])
def test_stream_seq_idx_edge_table(W, dtype):
    """tests/test_packed.py's edge rows (8 steps: one vector), as they are
    and stretched to two chunks and a partial one."""
    from test_packed import EDGE_ROWS
    table = np.stack([np.asarray(EDGE_ROWS[k], np.int32) for k in sorted(EDGE_ROWS)])
    rng = np.random.default_rng(W)
    for ids in (table, np.repeat(table, 264, axis=1)):
        x, w, b, init = inputs(rng, ids.shape[0], 24, ids.shape[1], W, dtype, False)
        sidx = jnp.asarray(ids)
        f = lambda x, w, b, h: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=sidx, initial_states=h,
                                                 return_final_states=True, backend="ffi")
        check(grads(f, (0, 1, 2, 3)), (x, w, b, init), dtype, f"stream seq_idx edge table {ids.shape}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [3, 4, 7, 8, 12, 16])
def test_stream_seq_idx_segment_across_chunk_edge(dtype, W):
    """A sequence that starts 1 .. W - 2 steps before a warp chunk's end
    (1024 steps in 16 bits, 512 in float32) and runs past it: the first
    steps after the chunk read it with some taps masked, and their g
    reaches the dx of its steps inside the chunk (the shared-ids
    backward's g after the chunk, masked; random ids rarely put a boundary
    there). One row per start, at both chunk edges of the row; a row whose
    sequence follows padding."""
    edge = 512 if dtype == "float32" else 1024
    L = 2 * edge + 40
    starts = list(range(1, W - 1))
    ids = np.zeros((len(starts) + 1, L), np.int32)
    for r, s in enumerate(starts):
        ids[r, edge - s:] = 1
        ids[r, 2 * edge - s:] = 2
    ids[-1, edge - 2 * W: edge - 2] = -1
    ids[-1, edge - 2:] = 1
    rng = np.random.default_rng(W + 101)
    x, w, b, init = inputs(rng, ids.shape[0], 20, L, W, dtype, False)
    f = lambda x, w, b, h: jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=jnp.asarray(ids),
                                             initial_states=h, backend="ffi")
    check(grads(f, (0, 1, 2, 3)), (x, w, b, init), dtype, "seq_idx across the chunk edge")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [2, 5, 8, 10, 14, 16])
@pytest.mark.parametrize("cl", [False, True])
def test_stream_seq_idx_nonfinite_other_sequence(dtype, W, cl):
    """An Inf or NaN input stays in its own sequence: the next sequence's
    outputs (and its dx, dweight) stay finite, as on the CPU. An Inf inside
    a sequence reaches only the W outputs that read it (W 10, 14: widths
    between the former buckets of 12 and 16 taps, inside one sequence)."""
    rng = np.random.default_rng(W)
    B, D, L = 1, 32 if cl else 20, 2056
    x, w, b, _ = inputs(rng, B, D, L, W, dtype, cl)
    ids = np.zeros((B, L), np.int32)
    ids[:, 1000:] = 1                       # a boundary near the bf16 chunk edge
    ids[:, 1500:] = 2
    x = with_steps(x, cl, {500: -np.inf,     # inside sequence 0
                           999: np.inf,      # last step of sequence 0
                           1499: np.nan})    # last step of sequence 1
    y, dx = seq_grads_vs_cpu(x, w, b, jnp.asarray(ids), cl, dtype)
    assert np.isfinite(y[:, :, 1000:1499]).all() and np.isfinite(y[:, :, 1500:]).all()
    # dx of sequence 1 up to the outputs that read its NaN; none of sequence 0's Inf
    assert np.isfinite(dx[:, :, 1000:1500 - W]).all()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [10, 14])
@pytest.mark.parametrize("cl", [False, True])
def test_bucket_absent_taps_nonfinite(dtype, W, cl):
    """At W 10 and 14 (widths the channels-last rows ran in buckets of 12
    and 16 taps, with absent leading taps, before the eighteenth session;
    now every kernel runs them at their own width) an Inf at a sequence's
    first step lies in the window of outputs W and W + 1 steps later, in a
    group whose window still reaches the sequence before (the masked
    steps): it must not reach them (0 * Inf), as on the CPU."""
    rng = np.random.default_rng(W + 11)
    B, D, L = 1, 32 if cl else 20, 2056
    x, w, b, _ = inputs(rng, B, D, L, W, dtype, cl)
    ids = np.zeros((B, L), np.int32)
    ids[:, 1000:] = 1
    x = with_steps(x, cl, {1000: np.inf})   # first step of sequence 1
    y, _ = seq_grads_vs_cpu(x, w, b, jnp.asarray(ids), cl, dtype)
    assert np.isfinite(y[:, :, 1000 + W:]).all()  # (the outputs past its reach)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [10, 11, 13, 14])
@pytest.mark.parametrize("cl", [False, True])
def test_bucket_dense_nonfinite(dtype, W, cl):
    """Dense rows at the bucket widths: an Inf and a NaN input, whose outputs
    (and their g) turn non-finite, lie under the absent taps of the outputs
    W .. 15 steps later (and of the inputs whose dx reads those g): y, dx,
    dweight and dbias must have the CPU's non-finite entries and no other
    (0 * Inf under an absent tap would spread NaN where the CPU has none)."""
    rng = np.random.default_rng(W + 53)
    B, D, L = 2, 32 if cl else 20, 2056
    x, w, b, _ = inputs(rng, B, D, L, W, dtype, cl)
    x = with_steps(x, cl, {600: np.inf, 1023: np.nan, 1500: -np.inf})
    f = grads(lambda x, w, b: jcc.causal_conv1d(x, w, b, activation="silu", channels_last=cl, backend="ffi"),
              (0, 1, 2))
    same_entries(run(GPU, f, x, w, b), run(CPU, f, x, w, b), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("W", [2, 4, 5, 8, 12, 16])
@pytest.mark.parametrize("cl", [False, True])
def test_rows_padding_groups(dtype, W, cl):
    """Long padding runs (in the middle, at the tail, a whole row): the
    channels-last rows' groups of padding write zeros (plus the residual)
    without computing, the channels-first shared-ids kernels mask them by
    their words; Inf and NaN in the padding leave every output, dx and
    dweight as the CPU has them (finite outside)."""
    rng = np.random.default_rng(W + 7)
    B, D, L = 3, 64, 1104
    x, w, b, init = inputs(rng, B, D, L, W, dtype, cl)
    res = jnp.asarray(rng.standard_normal(x.shape), x.dtype)
    ids = np.repeat(np.arange(4), -(-L // 4))[None, :L].repeat(B, 0).astype(np.int32)
    ids[:, 260:400] = -1          # padding in the middle (several groups / vectors)
    ids[:, 1030:] = -1            # a padded tail
    ids[2] = -1                   # a row of padding only
    xn = np.array(x.astype(jnp.float32))
    if cl:
        xn[0, 310, :] = np.inf    # non-finite inputs inside the padding
        xn[1, 1050, :] = np.nan
    else:
        xn[0, :, 310] = np.inf
        xn[1, :, 1050] = np.nan
    x = jnp.asarray(xn, x.dtype)
    sidx = jnp.asarray(ids)
    f = grads(lambda x, w, b, r, h: jcc.causal_conv1d(
        x, w, b, activation="silu", seq_idx=sidx, initial_states=h, return_final_states=True,
        residual=r, channels_last=cl, backend="ffi"), (0, 1, 2, 3, 4))
    got = run(GPU, f, x, w, b, res, init)
    same_entries(got, run(CPU, f, x, w, b, res, init), dtype)
    _, (dx, dw, db, dr, dh) = got
    assert np.isfinite(dw).all() and np.isfinite(db).all()
