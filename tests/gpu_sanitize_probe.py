"""Forward and backward calls on shapes that take every CUDA kernel family
(streaming, tensor-core, wide, channels-last rows and wide, tile; the state kernels; every decode
kernel), compared with the CPU kernels, small enough to run under
compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tests/gpu_sanitize_probe.py [PART NPARTS [wide]]
    compute-sanitizer --tool racecheck python3 tests/gpu_sanitize_probe.py --cases 25,26,28

A fault leaves the process's CUDA context unusable, so the cases can be split
into NPARTS processes (this one runs every NPARTS-th case from PART): one
faulty kernel then hides only the cases after it in its own part. `wide`
keeps only the convolutions at W > 12 (both wide families, the tensor-core
forwards and the tile family's wide widths), for the slower racecheck and synccheck;
`--cases` runs the cases of those indices into CASES (the order they are added in).
`PROBE_DTYPES=bfloat16,float32` keeps only the cases of those dtypes (and
those that name none: a development build of fewer dtypes).
`PROBE_WALK=only` keeps only the two large walk cases, `PROBE_WALK=skip` all
but them (initcheck takes minutes on them unless filtered to our streaming
kernels: `compute-sanitizer --tool initcheck --kernel-name kns=Stream`).
"""
import inspect
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc

cpu = jax.devices("cpu")[0]
# (channels-last decode in the public API: present once the serving work lands)
CL_DECODE = "channels_last" in inspect.signature(jcc.causal_conv1d_update).parameters
rng = np.random.default_rng(0)
PICKED = [int(v) for v in sys.argv[2].split(",")] if sys.argv[1:2] == ["--cases"] else None
PART, NPARTS = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 and PICKED is None else (0, 1)
CASES = []  # (what, thunk)


def case(what):
    def add(fn):
        CASES.append((what, fn))
        return fn
    return add


def agree(out, ref, dt, what):
    for a, e in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        a, e = np.asarray(a, np.float32), np.asarray(e, np.float32)
        tol = 0.05 if dt == jnp.bfloat16 else 1e-3
        assert np.allclose(a, e, rtol=tol, atol=tol * (1 + np.abs(e).max(initial=0))), what


CONFIGS = [  # dtype, (B, D, L), W, channels_last, mode
    (jnp.bfloat16, (2, 12, 520), 4, False, "states"),   # streaming, one partial chunk
    (jnp.bfloat16, (2, 8, 1040), 2, False, "seq"),      # streaming, masked
    (jnp.float32, (1, 4, 4360), 5, False, "seq"),       # streaming, masked, W 5, spans
    (jnp.bfloat16, (2, 8, 2056), 8, False, "states"),   # streaming, W 8
    (jnp.bfloat16, (2, 4, 1032), 11, False, "seq"),     # streaming, shared ids at W 11
    (jnp.float32, (1, 8, 800), 16, False, "states"),    # streaming, W 16
    (jnp.bfloat16, (2, 16, 600), 7, True, "seq"),       # channels-last rows, masked
    (jnp.float32, (1, 8, 300), 13, True, "states"),     # channels-last rows, W 13
    (jnp.float32, (1, 3, 4104), 4, False, "states"),    # streaming, several chunks
    (jnp.bfloat16, (8, 4096, 1032), 4, False, "plain"),  # streaming backward, warps spanning 2 chunks
    (jnp.float32, (2, 12, 520), 1, False, "plain"),
    (jnp.bfloat16, (2, 12, 520), 4, True, "states"),    # channels-last rows
    (jnp.float32, (2, 8, 1100), 3, True, "plain"),      # channels-last rows, several chunks
    (jnp.bfloat16, (2, 5, 67), 4, False, "states"),     # tile: rows not whole vectors
    (jnp.bfloat16, (2, 6, 300), 2, True, "states"),     # tile: dim not whole vectors
    (jnp.float32, (2, 40, 301), 5, False, "seq"),       # tile, masked, several chunks of 8 taps
    (jnp.bfloat16, (1, 33, 1100), 17, True, "seq"),     # tile, partial channel group, 3 tiles
    (jnp.float32, (1, 35, 300), 64, False, "states"),   # tile, wide
    (jnp.bfloat16, (2, 6, 4616), 40, False, "seq"),     # mma forward (masked tiles) + wide backward, 2 spans
    (jnp.float32, (1, 5, 1000), 17, False, "states"),   # wide family, partial chunk
    (jnp.bfloat16, (1, 4, 1048), 256, False, "plain"),  # mma forward + wide backward, widest
    (jnp.float16, (2, 3, 1160), 40, False, "states"),   # mma forward, initial states, partial tile
    (jnp.bfloat16, (2, 5, 1160), 14, False, "seq"),     # streaming, shared ids at W 14 (was: mma masked tiles)
    (jnp.bfloat16, (2, 16, 1160), 137, True, "states"), # channels-last mma forward, 2 groups, partial tile
    (jnp.bfloat16, (2, 32, 1160), 24, True, "states"),  # channels-last mma forward, 2 groups of 16 channels
    (jnp.bfloat16, (2, 16, 1160), 20, True, "seq"),     # channels-last mma forward, masked tiles, staged ids
    (jnp.float16, (2, 8, 1160), 80, True, "seq"),       # the same at the k-step bucket of 9
    (jnp.bfloat16, (1, 20, 700), 256, True, "seq"),     # tile, widest, large shared memory
    (jnp.bfloat16, (2, 16, 4616), 40, True, "seq"),     # channels-last mma forward + wide backward, masked, 2 spans
    (jnp.float32, (1, 8, 1000), 17, True, "states"),    # channels-last wide, 32-byte rows, partial chunk
    (jnp.float32, (1, 8, 1048), 256, True, "seq"),      # channels-last wide, widest, most shared memory
    (jnp.bfloat16, (2, 64, 700), 4, True, "seq"),       # channels-last rows, seq_idx by selects (W <= 8), chunks
    (jnp.float32, (1, 8, 300), 2, True, "seq"),         # the same, float32, 2 channels a thread
    # streaming seq_idx at W <= 8 (ids shared by 8 channels,
    # cuda/stream_ids.cuh): partial groups
    (jnp.bfloat16, (2, 20, 2056), 6, False, "seq"),
    (jnp.float32, (1, 33, 1104), 8, False, "seq"),
    # channels-last rows with long padding runs: groups of one sequence,
    # masked groups, groups of padding only (H > a group at W = 16)
    (jnp.bfloat16, (2, 64, 1100), 3, True, "seqpad"),
    (jnp.bfloat16, (2, 64, 1100), 8, True, "seqpad"),
    (jnp.bfloat16, (1, 32, 1100), 16, True, "seqpad"),
    # the same through the channels-first shared-ids kernels (whole vectors of padding)
    (jnp.bfloat16, (2, 40, 1104), 4, False, "seqpad"),
    (jnp.float32, (1, 24, 1104), 7, False, "seqpad"),
    # channels-last rows' seq_idx by selects at W 10
    (jnp.float32, (1, 16, 1100), 10, True, "seqpad"),
    # channels-last rows at W 12 and 16
    # (bfloat16 W 13..16 forwards take the rows, not the tensor-core kernel)
    (jnp.bfloat16, (2, 64, 1100), 12, True, "plain"),
    (jnp.bfloat16, (1, 32, 1100), 16, True, "states"),
    # channels-last rows, 16-bit W > 8 with a partial warp (20 channels)
    (jnp.bfloat16, (2, 20, 700), 14, True, "seq"),
]
def conv_case(dt, B, D, L, W, cl, mode):
    shape = (B, L, D) if cl else (B, D, L)
    x = jnp.asarray(rng.standard_normal(shape), dt)
    h = jnp.asarray(rng.standard_normal((B, W - 1, D) if cl else (B, D, W - 1)), dt)
    r = jnp.asarray(rng.standard_normal(shape), dt)
    w, b = jnp.asarray(rng.standard_normal((D, W)) / W, dt), jnp.asarray(rng.standard_normal((D,)), dt)
    ids = np.sort(rng.integers(0, 5, (B, L)), axis=1)
    ids[:, L // 3: L // 3 + 4] = -1
    ids[:, -5:] = -1
    ids[:, L // 2: L // 2 + 3] = 9
    ids[:, L // 2 + 20: L // 2 + 22] = 9
    if mode == "seqpad":
        ids[:, L // 4: L // 4 + 45] = -1
        ids[:, -70:] = -1
    s = jnp.asarray(ids, jnp.int32) if mode in ("seq", "seqpad") else None
    hh = h if mode in ("states", "seq", "seqpad") else None

    def loss(x, w, b, h, r):
        # ("plain" cases without a residual: kernels that choose their
        # residual at compile time run both ways)
        y, f = jcc.causal_conv1d(x, w, b, activation="silu", residual=None if mode == "plain" else r,
                                 seq_idx=s,
                                 initial_states=h if hh is not None else None,
                                 return_final_states=True, channels_last=cl, backend="ffi")
        return jnp.sum(y.astype(jnp.float32) ** 2) + jnp.sum(f.astype(jnp.float32))

    g = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
    out = g(x, w, b, h, r)
    ref = g(*(jax.device_put(a, cpu) for a in (x, w, b, h, r)))
    agree(out, ref, dt, (dt, B, D, L, W, cl, mode))


for dt, (B, D, L), W, cl, mode in CONFIGS:
    case(("conv", dt.__name__, B, D, L, W, cl, mode))(
        lambda c=(dt, B, D, L, W, cl, mode): conv_case(*c))


def nonfinite_case(D, L, W, cl):
    """The tensor-core forwards' exact fallback: chunks holding an Inf or NaN input."""
    x = rng.standard_normal((2, D, L)).astype(np.float32)
    x[0, :, L // 3] = np.inf
    x[1, :, L // 2] = np.nan
    x = jnp.asarray(np.swapaxes(x, 1, 2) if cl else x, jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((D, W)) / W, jnp.bfloat16)
    f = jax.jit(lambda x, w: jcc.causal_conv1d(x, w, channels_last=cl, backend="ffi"))
    a = np.asarray(f(x, w), np.float32)
    e = np.asarray(f(*(jax.device_put(v, cpu) for v in (x, w))), np.float32)
    assert np.array_equal(np.isfinite(a), np.isfinite(e)), ("nonfinite", D, L, W, cl)
    agree(np.where(np.isfinite(a), a, 0), np.where(np.isfinite(e), e, 0), jnp.bfloat16, ("nonfinite", W, cl))


for D, L, W, cl in ((5, 1160, 40, False), (16, 1160, 137, True)):
    case(("conv", "nonfinite", 2, D, L, W, cl))(lambda c=(D, L, W, cl): nonfinite_case(*c))

# varlen: per-sequence starts and state rows (channels-last rows for W <= 16
# and dim a whole number of vectors, the tile family otherwise)
cu = jnp.asarray([0, 5, 5, 300, 301, 900], jnp.int32)
xv = jnp.asarray(rng.standard_normal((900, 24)), jnp.float32)


def varlen_case(W):
    wv = jnp.asarray(rng.standard_normal((24, W)) / W, jnp.float32)
    hv = jnp.asarray(rng.standard_normal((5, 24, W - 1)), jnp.float32)

    def vloss(x, w, h):
        y, f = jcc.causal_conv1d_varlen(x, w, cu_seqlens=cu, initial_states=h, activation="silu",
                                        return_final_states=True)
        return jnp.sum(y ** 2) + jnp.sum(f)

    g = jax.jit(jax.value_and_grad(vloss, argnums=(0, 1, 2)))
    agree(g(xv, wv, hv), g(*(jax.device_put(a, cpu) for a in (xv, wv, hv))), jnp.float32, ("varlen", W))


for W in (4, 9, 20):
    case(("varlen", W))(lambda W=W: varlen_case(W))

# decode: the vector kernels (state_len = W - 1, aligned) and the general
# one, both state layouts, rolling and circular, with a padding row; (3, 256):
# 4 channels, one row per thread; (100, 4096): 8 channels, one row per
# thread, staged state rows; (600, 2048): several rows per thread, staged;
# (400, 1028): 4 channels, several rows per thread
for B, D, SL in ((3, 48, 3), (3, 36, 5), (3, 256, 3), (100, 4096, 3), (600, 2048, 3), (400, 1028, 3)):
    for cl in (False, True) if CL_DECODE else (False,):
        x = jnp.asarray(rng.standard_normal((B, D)), jnp.bfloat16)
        st = jnp.asarray(rng.standard_normal((B + 1, SL, D) if cl else (B + 1, D, SL)), jnp.bfloat16)
        w, b = jnp.asarray(rng.standard_normal((D, 4)), jnp.float32), jnp.asarray(rng.standard_normal((D,)), jnp.float32)
        idx = np.arange(B, dtype=np.int32)[::-1].copy()
        idx[1] = -1
        for kw in ({}, {"cache_seqlens": jnp.asarray(np.arange(B) * 5 % 7, jnp.int32),
                        "conv_state_indices": jnp.asarray(idx)}):
            clkw = {"channels_last": True} if cl else {}

            @case(("update", B, D, SL, cl, bool(kw)))
            def _(x=x, st=st, w=w, b=b, clkw=clkw, kw=kw, what=("update", B, D, cl)):
                f = jax.jit(lambda x, st: jcc.causal_conv1d_update(x, st, w, b, activation="silu",
                                                                   **clkw, **kw))
                agree(f(x, st), f(*(jax.device_put(a, cpu) for a in (x, st))), jnp.bfloat16, what)
for cl in (False, True) if CL_DECODE else ():
    @case(("varlen_states", cl))
    def _(cl=cl):
        f = jax.jit(lambda x: jcc.causal_conv1d_varlen_states(x, cu, 6, channels_last=cl))
        agree(f(xv), f(jax.device_put(xv, cpu)), jnp.float32, ("varlen_states", cl))



def same_under_env(name, value, reference, run, what):
    """run()'s outputs with the environment variable `name` at `value` equal,
    bit for bit, those at `reference` (run jits anew at each call: a program
    replayed from a CUDA graph keeps the launch it recorded)."""
    try:
        os.environ[name] = value
        got = run()
        os.environ[name] = reference
        want = run()
    finally:
        del os.environ[name]
    for a, e in zip(got, want):
        assert np.array_equal(np.asarray(a, np.float32), np.asarray(e, np.float32)), what


def walk_case(dt, B, D, L, W, mode):
    """The streaming forward walking 4 chunks a warp (JCC_FWD_SPAN=4)
    against one chunk a warp (JCC_FWD_SPAN=1): bit for bit."""
    x = jnp.asarray(rng.standard_normal((B, D, L)), dt)
    h = jnp.asarray(rng.standard_normal((B, D, W - 1)), dt)
    r = jnp.asarray(rng.standard_normal((B, D, L)), dt)
    w, b = jnp.asarray(rng.standard_normal((D, W)) / W, dt), jnp.asarray(rng.standard_normal((D,)), dt)
    ids = np.zeros((B, L), np.int32)
    ids[:, L // 3:] = 1
    ids[:, -7:] = -1
    s = jnp.asarray(ids) if mode == "seq" else None
    run = lambda: jax.jit(lambda x, w, b, h, r: jcc.causal_conv1d(  # noqa: E731
        x, w, b, activation="silu", residual=r, seq_idx=s, initial_states=h,
        return_final_states=True, backend="ffi"))(x, w, b, h, r)
    same_under_env("JCC_FWD_SPAN", "4", "1", run, ("walk", W, mode))


# (rows x chunks >= 65536, or no warp walks: see tests/test_gpu_fwd_span.py)
# (the hand-over into a partial chunk: bf16 one full chunk + 8 steps; float32
# five full + 12: a full span, then a short one ending in the partial chunk)
for dt, (B, D, L), W, mode in ((jnp.bfloat16, (2, 16398, 1032), 4, "states"),
                               (jnp.float32, (1, 32770, 2572), 11, "states")):  # (seq_idx never walks)
    case(("walk", dt.__name__, B, D, L, W, mode))(lambda c=(dt, B, D, L, W, mode): walk_case(*c))

# decode, the general kernel's register window (W <= 4, <= 8) and its
# any-width loop (W > 8): multi-token steps through the speculative ring and
# the rolling state, one row padding (added last: the case numbers above
# are named in docs).
# (D = 256: channels-first state blocks staged through shared memory)
for W, S, SL, D in ((4, 3, 6, 40), (6, 5, 7, 40), (10, 3, 9, 40), (4, 1, 6, 256), (3, 4, 2, 256)):
    for cl in (False, True) if CL_DECODE else (False,):
        B = 3
        x = jnp.asarray(rng.standard_normal((B, S, D) if cl else (B, D, S)), jnp.bfloat16)
        st = jnp.asarray(rng.standard_normal((B + 1, SL, D) if cl else (B + 1, D, SL)), jnp.bfloat16)
        w, b = jnp.asarray(rng.standard_normal((D, W)), jnp.float32), jnp.asarray(rng.standard_normal((D,)), jnp.float32)
        for kw in ({"conv_state_indices": jnp.asarray([2, -1, 0], jnp.int32)},
                   {"cache_seqlens": jnp.asarray([0, 5, 13], jnp.int32),
                    "conv_state_indices": jnp.asarray([2, -1, 0], jnp.int32)}):
            clkw = {"channels_last": True} if cl else {}

            @case(("update_multi", W, S, SL, D, cl, len(kw)))
            def _(x=x, st=st, w=w, b=b, clkw=clkw, kw=kw, what=("update_multi", W, S, cl)):
                f = jax.jit(lambda x, st: jcc.causal_conv1d_update(x, st, w, b, activation="silu",
                                                                   **clkw, **kw))
                agree(f(x, st), f(*(jax.device_put(a, cpu) for a in (x, st))), jnp.bfloat16, what)


def cl_slice_case(dt, B, D, L, W, mode, steps, base):
    """The channels-last row forward at its longer slice (JCC_CL_FWD_STEPS)
    against the base slice: bit for bit."""
    x = jnp.asarray(rng.standard_normal((B, L, D)), dt)
    h = jnp.asarray(rng.standard_normal((B, W - 1, D)), dt)
    r = jnp.asarray(rng.standard_normal((B, L, D)), dt)
    w, b = jnp.asarray(rng.standard_normal((D, W)) / W, dt), jnp.asarray(rng.standard_normal((D,)), dt)
    ids = np.zeros((B, L), np.int32)
    ids[:, 300:] = 1
    ids[:, 511:513] = [[2, 3]] * B
    ids[:, -7:] = -1
    s = jnp.asarray(ids) if mode == "seq" else None
    run = lambda: jax.jit(lambda x, w, b, h, r: jcc.causal_conv1d(  # noqa: E731
        x, w, b, activation="silu", residual=r, seq_idx=s, initial_states=h,
        return_final_states=True, channels_last=True, backend="ffi"))(x, w, b, h, r)
    same_under_env("JCC_CL_FWD_STEPS", str(steps), str(base), run, ("cl slice", W, mode))


# the channels-last row forward's longer slices (cases 97..99)
for dt, (B, D, L), W, mode, steps, base in ((jnp.bfloat16, (2, 24, 1100), 11, "seq", 256, 128),
                                            (jnp.float32, (1, 8, 2100), 16, "states", 256, 128),
                                            (jnp.bfloat16, (2, 40, 1100), 8, "seq", 128, 64)):
    case(("clslice", dt.__name__, B, D, L, W, mode))(
        lambda c=(dt, B, D, L, W, mode, steps, base): cl_slice_case(*c))

# the channels-first shared-ids kernels at W 12 and 16 (cases 100..102:
# mask words of 96 and 128 bits at 16-bit types, float32's halo of 4 lanes)
for dt, (B, D, L), W, cl, mode in ((jnp.bfloat16, (2, 20, 2056), 12, False, "seq"),
                                   (jnp.float16, (1, 12, 1104), 16, False, "seqpad"),
                                   (jnp.float32, (1, 33, 1104), 16, False, "seq")):
    case(("conv", dt.__name__, B, D, L, W, cl, mode))(
        lambda c=(dt, B, D, L, W, cl, mode): conv_case(*c))

# 103, 104: the channels-first shared-ids kernels at W 9 and 13 (each W
# compiled at its own width; cases 4 and 22: W 11 and 14)
for dt, (B, D, L), W, cl, mode in ((jnp.float16, (2, 16, 2056), 9, False, "seq"),
                                   (jnp.float32, (1, 12, 1104), 13, False, "seqpad")):
    case(("conv", dt.__name__, B, D, L, W, cl, mode))(
        lambda c=(dt, B, D, L, W, cl, mode): conv_case(*c))

# 105, 106: the channels-first streaming kernels, one sequence a row, at
# widths between 8 and 16 (each compiled at its own width; 16-bit W 13..16
# took the tensor-core forward before the eighteenth session)
for dt, (B, D, L), W, cl, mode in ((jnp.bfloat16, (2, 8, 2056), 13, False, "plain"),
                                   (jnp.float16, (1, 12, 1104), 10, False, "states")):
    case(("conv", dt.__name__, B, D, L, W, cl, mode))(
        lambda c=(dt, B, D, L, W, cl, mode): conv_case(*c))



def env_case(env, c):
    """conv_case with environment variables set (an opt-in kernel)."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        conv_case(*c)
    finally:
        for k, v in old.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v


# 107..109: the tensor-core backward (opt-in, JCC_BWD_MMA=1): one chunk a
# span, and spans of 8 (the hand-over between chunks, a partial last chunk)
for dt, (B, D, L), W, cl, mode, span in ((jnp.bfloat16, (2, 12, 520), 4, False, "plain", "1"),
                                         (jnp.bfloat16, (2, 8, 2056), 8, False, "states", "8"),
                                         (jnp.bfloat16, (1, 5, 1040), 2, False, "states", "8")):
    case(("conv", dt.__name__, B, D, L, W, cl, mode, "bwd_mma", span))(
        lambda c=(dt, B, D, L, W, cl, mode), span=span: env_case(
            {"JCC_BWD_MMA": "1", "JCC_BWD_MMA_SPAN": span}, c))

# 110..111: the channels-last row forward at W 2..4 in W 5..8's words and
# slices (thirty-fourth session), seq_idx and states at the longer slice
for dt, (B, D, L), W, mode, steps, base in ((jnp.bfloat16, (2, 40, 1100), 4, "seq", 128, 64),
                                            (jnp.float32, (1, 12, 1100), 2, "states", 128, 64)):
    case(("clslice", dt.__name__, B, D, L, W, mode))(
        lambda c=(dt, B, D, L, W, mode, steps, base): cl_slice_case(*c))

# 112..113: the channels-last rows at W = 1 in W 2's words, slices and
# unrolled groups (thirty-fifth session)
for dt, (B, D, L), W, cl, mode in ((jnp.bfloat16, (2, 64, 700), 1, True, "seqpad"),
                                   (jnp.float32, (1, 8, 300), 1, True, "states")):
    case(("conv", dt.__name__, B, D, L, W, cl, mode))(
        lambda c=(dt, B, D, L, W, cl, mode): conv_case(*c))

# 114..121: the channels-first seq_idx forward and backward reading mask
# words made once a row (forced, JCC_SEQ_WORDS_FWD=1 and JCC_SEQ_WORDS=1;
# the forward's since the fortieth session): one chunk a span, padding, 8 x 4096
# rows whose warps walk spans of 2 chunks; float16 W 7 with 4 blocks an SM
# asked (thirty-sixth session); W 16 / 12 (thirty-seventh: bf16 W 16's
# words are MaskWords<4>, float32 W 12's 64-bit); bf16 W 10 (MaskWords<3>,
# thirty-eighth); float32 W 4 (the plan's since the thirty-ninth)
for dt, (B, D, L), W, mode in ((jnp.bfloat16, (2, 20, 2056), 4, "seq"),
                               (jnp.float32, (1, 33, 1104), 8, "seqpad"),
                               (jnp.bfloat16, (8, 4096, 1032), 8, "seq"),
                               (jnp.float16, (1, 33, 1104), 7, "seqpad"),
                               (jnp.bfloat16, (2, 20, 2056), 16, "seqpad"),
                               (jnp.float32, (1, 33, 1104), 12, "seq"),
                               (jnp.bfloat16, (2, 20, 2056), 10, "seqpad"),
                               (jnp.float32, (2, 20, 2056), 4, "seqpad")):
    case(("conv", dt.__name__, B, D, L, W, False, mode, "seq_words"))(
        lambda c=(dt, B, D, L, W, False, mode): env_case({"JCC_SEQ_WORDS": "1", "JCC_SEQ_WORDS_FWD": "1"}, c))

mine = [CASES[i] for i in PICKED] if PICKED is not None else CASES[PART::NPARTS]
if sys.argv[3:] == ["wide"]:
    mine = [(w, f) for w, f in mine if w[0] == "conv" and w[5] > 12]
if os.environ.get("PROBE_DTYPES"):
    _kept = set(os.environ["PROBE_DTYPES"].split(","))
    mine = [(w, f) for w, f in mine
            if not any(v in ("float32", "float16", "bfloat16") and v not in _kept for v in w)]
if os.environ.get("PROBE_WALK") in ("only", "skip"):
    mine = [(w, f) for w, f in mine if (w[0] == "walk") == (os.environ["PROBE_WALK"] == "only")]
for i, (what, fn) in enumerate(mine):
    try:
        fn()
    except Exception as e:  # the context may be unusable now: report and stop
        print(f"PROBE FAIL at {what}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
        print(f"not run after it: {[w for w, _ in mine[i + 1:]]}")
        sys.exit(1)
print(f"PROBE OK: {len(mine)} configurations (part {PART} of {NPARTS})")
