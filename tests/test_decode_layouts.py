"""Channels-last decoding: causal_conv1d_update(channels_last=True) with x (B, D)
or (B, S, D) and conv_state (N, state_len, D), and causal_conv1d_varlen_states
(channels_last=True) -> (N, state_len, D), against the jnp reference, the numpy
oracle (tests/oracle_decode.py) and the channels-first call; no transposes on
the kernel path; in place under jit with donation; vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_causal_conv as jcc
from jax_causal_conv import reference
from jax_causal_conv._lowering import targets

import oracle
import oracle_decode
from helpers import DTYPES, close, custom_calls, rand, to_np


def _t(a):
    """Swap the time and channel axes of a 3-D array (test-side layout change)."""
    return None if a is None else jnp.swapaxes(a, 1, 2)


def _case(rng, B, D, S, W, N, SL, dtype=jnp.float32):
    xs = (B, D) if S is None else (B, S, D)           # channels-last x
    x = rand(rng, xs, dtype)
    st = rand(rng, (N, SL, D), dtype)
    w, b = rand(rng, (D, W)), rand(rng, (D,))
    return x, st, w, b


def _oracle(x, st, w, b, act, cl, **kw):
    """The oracle on channels-last (cl) or channels-first arrays, same layout out."""
    single = x.ndim == 2
    xf = x[..., None] if single else (_t(x) if cl else x)
    sf = _t(st) if cl else st
    y, ns = oracle_decode.update(to_np(xf), to_np(sf), to_np(w), to_np(b), act, **kw)
    if single:
        y = y[..., 0]
    elif cl:
        y = np.swapaxes(y, 1, 2)
    return y, (np.swapaxes(ns, 1, 2) if cl else ns)


MODES = {
    "rolling": {},
    "circular": dict(cache_seqlens=[0, 5, 13, 2, 7]),
    "slots": dict(conv_state_indices=[4, -1, 0, 2, -1]),
    "slots_circular": dict(cache_seqlens=[1, 9, 3, 0, 4], conv_state_indices=[3, -1, 1, 5, 0]),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("W,extra", [(1, 0), (2, 0), (4, 0), (4, 3), (5, 6)])
@pytest.mark.parametrize("S", [None, 1, 3, 9])
def test_channels_last_update_matches_oracle_reference_and_channels_first(mode, W, extra, S):
    rng = np.random.default_rng(W * 31 + extra + (S or 0))
    B, D, N, SL = 5, 12, 6, W - 1 + extra
    x, st, w, b = _case(rng, B, D, S, W, N, SL)
    kw = {k: jnp.asarray(v, jnp.int32) for k, v in MODES[mode].items()}
    if "conv_state_indices" not in kw:
        st = st[:B]
    y, ns = jcc.causal_conv1d_update(x, st, w, b, activation="silu", channels_last=True,
                                     backend="ffi", **kw)
    assert y.shape == x.shape and ns.shape == st.shape
    yo, nso = _oracle(x, st, w, b, "silu", True, **{k: np.asarray(v) for k, v in kw.items()})
    close(y, yo, jnp.float32)
    np.testing.assert_array_equal(np.asarray(ns, np.float64), nso)  # the state moves raw bits
    yr, nsr = reference.causal_conv1d_update(x, st, w, b, activation="silu", channels_last=True,
                                             **kw)
    close(y, yr, jnp.float32)
    np.testing.assert_array_equal(ns, nsr)
    xla = jcc.causal_conv1d_update(x, st, w, b, activation="silu", channels_last=True,
                                   backend="xla", **kw)
    close(xla[0], yo, jnp.float32)
    np.testing.assert_array_equal(xla[1], nso)
    # the same numbers as the channels-first call on transposed arrays
    xf = x if S is None else _t(x)
    yf, nsf = jcc.causal_conv1d_update(xf, _t(st), w, b, activation="silu", backend="ffi", **kw)
    np.testing.assert_array_equal(y, yf if S is None else _t(yf))
    np.testing.assert_array_equal(ns, _t(nsf))
    if "conv_state_indices" in kw:  # padding rows: zero output; unpointed slots untouched
        pad = np.asarray(kw["conv_state_indices"]) < 0
        assert not np.asarray(y)[pad].any()
        used = set(np.asarray(kw["conv_state_indices"]).tolist())
        for n in range(N):
            if n not in used:
                np.testing.assert_array_equal(ns[n], st[n])


def test_oracle_catches_a_planted_bug():
    """The oracle is not the reference: a wrong tap order is caught."""
    rng = np.random.default_rng(0)
    x, st, w, b = _case(rng, 2, 4, 3, 4, 2, 5)
    cs = jnp.asarray([3, 8], jnp.int32)
    y, _ = jcc.causal_conv1d_update(x, st, w[:, ::-1], b, channels_last=True, cache_seqlens=cs)
    yo, _ = _oracle(x, st, w, b, None, True, cache_seqlens=np.asarray(cs))
    assert np.abs(np.asarray(y) - yo).max() > 1e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
@pytest.mark.parametrize("circular", [False, True])
def test_channels_last_update_dtypes(dtype, circular):
    rng = np.random.default_rng(3)
    B, D, W, SL = 3, 16, 4, 6
    x, st, w, b = _case(rng, B, D, 2, W, B, SL, DTYPES[dtype])
    kw = dict(cache_seqlens=jnp.asarray([0, 4, 9], jnp.int32)) if circular else {}
    y, ns = jcc.causal_conv1d_update(x, st, w, b, activation="silu", channels_last=True, **kw)
    assert y.dtype == x.dtype and ns.dtype == st.dtype
    yo, nso = _oracle(x, st, w, b, "silu", True, **{k: np.asarray(v) for k, v in kw.items()})
    close(y, yo, x.dtype, 4)
    np.testing.assert_array_equal(np.asarray(ns, np.float64), nso)


@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("W", [2, 4, 7])
def test_channels_last_token_by_token_equals_full(circular, W):
    rng = np.random.default_rng(W)
    B, D, L = 2, 8, 19
    x, w, b = rand(rng, (B, L, D)), rand(rng, (D, W)), rand(rng, (D,))
    want = jcc.causal_conv1d(x, w, b, activation="silu", channels_last=True)
    SL = W - 1 + (2 if circular else 0)
    state = jnp.zeros((B, SL, D))
    seen = jnp.zeros((B,), jnp.int32)
    step = jax.jit(lambda xt, s, c: jcc.causal_conv1d_update(
        xt, s, w, b, activation="silu", channels_last=True,
        cache_seqlens=c if circular else None), donate_argnums=1)
    ys = []
    for t in range(L):
        y, state = step(x[:, t], state, seen)
        seen = seen + 1
        ys.append(y)
    close(jnp.stack(ys, 1), want, jnp.float32)
    for bi in range(B):
        close(jnp.stack(ys, 1)[bi].T, oracle_decode.stream(to_np(x[bi].T), to_np(w), to_np(b),
                                                           "silu"), jnp.float32)


def _ops(jaxpr):
    out = []
    for e in jaxpr.eqns:
        out.append(e.primitive.name)
        for sub in jax.core.subjaxprs(e) if hasattr(jax.core, "subjaxprs") else ():
            out += _ops(sub)
        for p in e.params.values():  # nested jaxprs (pjit, custom_vmap, ...)
            for j in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(j, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    out += _ops(inner)
                elif hasattr(j, "eqns"):
                    out += _ops(j)
    return out


@pytest.mark.on_cpu  # (float64: the CPU's custom call)
@pytest.mark.parametrize("single", [True, False])
@pytest.mark.parametrize("circular", [False, True])
def test_channels_last_kernel_path_has_no_transpose(single, circular):
    B, D, W, SL = 4, 32, 4, 7
    x = jnp.ones((B, D) if single else (B, 3, D))
    st, w, b = jnp.zeros((6, SL, D)), jnp.ones((D, W)), jnp.ones((D,))
    cs, idx = jnp.asarray([0, 1, 2, 3], jnp.int32), jnp.asarray([5, -1, 0, 2], jnp.int32)

    def f(x, st):
        return jcc.causal_conv1d_update(x, st, w, b, activation="silu", channels_last=True,
                                        cache_seqlens=cs if circular else None,
                                        conv_state_indices=idx, backend="ffi")

    ops = _ops(jax.make_jaxpr(f)(x, st).jaxpr)
    assert "ffi_call" in ops, ops
    assert "transpose" not in ops, ops
    hlo = jax.jit(f, donate_argnums=1).lower(x, st).compile().as_text()
    assert custom_calls(hlo) == 1
    assert "transpose(" not in hlo and " copy(" not in hlo, hlo
    vs = jax.jit(lambda x: jcc.causal_conv1d_varlen_states(
        x, jnp.asarray([0, 2, 5], jnp.int32), SL, channels_last=True)).lower(
            jnp.ones((5, D))).compile().as_text()
    assert custom_calls(vs) == 1 and "transpose(" not in vs


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("circular", [False, True])
def test_update_without_slot_indices_computes_nothing_else(channels_last, circular):
    """Without conv_state_indices the kernels read row b's state from slot b
    themselves: the compiled update is the custom call and bitcasts, no
    iota of slot numbers (which once cost a GPU kernel per layer of a
    decode step), and it equals the reference."""
    B, D, W = 4, 32, 4
    rng = np.random.default_rng(3)
    x, w = rand(rng, (B, D)), rand(rng, (D, W))
    st = rand(rng, (B, W - 1, D) if channels_last else (B, D, W - 1))
    cs = jnp.asarray([0, 5, 2, 7], jnp.int32) if circular else None

    def f(x, st, mod):
        return mod.causal_conv1d_update(x, st, w, activation="silu", cache_seqlens=cs,
                                        channels_last=channels_last, **(
                                            {"backend": "ffi"} if mod is jcc else {}))

    step = jax.jit(lambda x, st: f(x, st, jcc), donate_argnums=1)
    entry = step.lower(x, st).compile().as_text().split("ENTRY")[1]
    assert custom_calls(entry) == 1
    assert "iota" not in entry and "fusion(" not in entry, entry
    y, ns = f(x, st, reference)
    y2, ns2 = step(x, jnp.array(st))
    close(y2, y, jnp.float32)
    np.testing.assert_array_equal(np.asarray(ns2), np.asarray(ns))


@pytest.mark.on_cpu  # (float64: the CPU's custom call)
@pytest.mark.parametrize("single", [True, False])
def test_channels_last_update_is_in_place_when_donated(single):
    B, D, W = 3, 16, 4
    w = jnp.ones((D, W))
    step = jax.jit(lambda x, s, c: jcc.causal_conv1d_update(x, s, w, channels_last=True,
                                                           cache_seqlens=c), donate_argnums=1)
    x = jnp.ones((B, D) if single else (B, 2, D))
    state = jnp.zeros((B, W + 1, D))
    cs = jnp.zeros((B,), jnp.int32)
    hlo = step.lower(x, state, cs).compile().as_text()
    assert targets.UPDATE in hlo and "input_output_alias" in hlo
    ptr = state.unsafe_buffer_pointer()
    _, new = step(x, state, cs)
    assert new.unsafe_buffer_pointer() == ptr
    assert new.shape == (B, W + 1, D)


@pytest.mark.parametrize("weights", ["shared", "mapped"])
def test_channels_last_update_vmap(weights):
    rng = np.random.default_rng(5)
    n, B, D, W, N, SL = 3, 2, 8, 4, 4, 6
    xs = rand(rng, (n, B, 2, D))
    sts = rand(rng, (n, N, SL, D))
    ws = rand(rng, (n, D, W)) if weights == "mapped" else rand(rng, (D, W))
    idx = jnp.asarray([[3, -1], [0, 1], [-1, 2]], jnp.int32)
    cs = jnp.asarray([[1, 2], [7, 0], [4, 4]], jnp.int32)
    w_ax = 0 if weights == "mapped" else None

    def one(x, s, w, i, c, mod):
        return mod.causal_conv1d_update(x, s, w, activation="silu", conv_state_indices=i,
                                        cache_seqlens=c, channels_last=True)

    f = jax.jit(jax.vmap(lambda *a: one(*a, jcc), in_axes=(0, 0, w_ax, 0, 0)))
    y, ns = f(xs, sts, ws, idx, cs)
    hlo = f.lower(xs, sts, ws, idx, cs).compile().as_text()
    assert custom_calls(hlo) == 1
    for i in range(n):
        wi = ws[i] if weights == "mapped" else ws
        yo, nso = _oracle(xs[i], sts[i], wi, None, "silu", True, cache_seqlens=np.asarray(cs[i]),
                          conv_state_indices=np.asarray(idx[i]))
        close(y[i], yo, jnp.float32)
        np.testing.assert_array_equal(np.asarray(ns[i], np.float64), nso)
    yr, nsr = jax.vmap(lambda *a: one(*a, reference), in_axes=(0, 0, w_ax, 0, 0))(
        xs, sts, ws, idx, cs)
    close(y, yr, jnp.float32)
    np.testing.assert_array_equal(ns, nsr)


@pytest.mark.parametrize("cu", [[0, 5, 6, 6, 30], [0, 1], [0, 0, 3, 3, 17, 18]])
@pytest.mark.parametrize("state_len", [0, 1, 3, 8])
def test_varlen_states_channels_last(cu, state_len):
    rng = np.random.default_rng(state_len)
    x = rand(rng, (cu[-1], 5))
    cua = jnp.asarray(cu, jnp.int32)
    got = jcc.causal_conv1d_varlen_states(x, cua, state_len, channels_last=True)
    assert got.shape == (len(cu) - 1, state_len, 5)
    want = np.swapaxes(oracle.varlen_states(to_np(x), cu, state_len), 1, 2)
    np.testing.assert_array_equal(np.asarray(got, np.float64), want)
    np.testing.assert_array_equal(got, reference.causal_conv1d_varlen_states(
        x, cua, state_len, channels_last=True))
    np.testing.assert_array_equal(got, jcc.causal_conv1d_varlen_states(
        x, cua, state_len, channels_last=True, backend="xla"))
    np.testing.assert_array_equal(got, _t(jcc.causal_conv1d_varlen_states(x, cua, state_len)))


def test_varlen_states_channels_last_vmap_and_prefill_handoff():
    """vmap folds the packs; the states continue decoding in the channels-last update."""
    rng = np.random.default_rng(2)
    D, W = 6, 4
    cu = jnp.asarray([[0, 3, 9], [0, 7, 9]], jnp.int32)
    x = rand(rng, (2, 9, D))
    f = jax.jit(jax.vmap(lambda x, cu: jcc.causal_conv1d_varlen_states(
        x, cu, W - 1, channels_last=True)))
    got = f(x, cu)
    assert custom_calls(f.lower(x, cu).compile().as_text()) == 1
    for i in range(2):
        want = np.swapaxes(oracle.varlen_states(to_np(x[i]), np.asarray(cu[i]).tolist(), W - 1),
                           1, 2)
        np.testing.assert_array_equal(np.asarray(got[i], np.float64), want)
    # prefill (varlen) -> decode (channels-last update) equals the one-shot conv
    w = rand(rng, (D, W))
    xs = x[0]
    st = got[0]                                            # (2, W-1, D)
    nxt = rand(rng, (2, 4, D))
    y, _ = jcc.causal_conv1d_update(nxt, st, w, channels_last=True)
    for n, (s, e) in enumerate([(0, 3), (3, 9)]):
        seq = jnp.concatenate([xs[s:e], nxt[n]])[None]
        full = jcc.causal_conv1d(seq, w, channels_last=True)[0, e - s:]
        close(y[n], full, jnp.float32)


@pytest.mark.parametrize("case,exc,words", [
    (dict(conv_state=jnp.ones((2, 4, 3))), ValueError, ["conv_state", "(num_slots, state_len, 8)"]),
    (dict(conv_state=jnp.ones((2, 2, 8))), ValueError, ["state_len", "2"]),
    (dict(x=jnp.ones((2, 3, 5))), ValueError, ["weight", "(5, width)"]),
    (dict(x=jnp.ones((2, 1, 3, 8))), ValueError, ["x", "(batch, seqlen, dim)"]),
    (dict(channels_last=1), TypeError, ["channels_last", "bool"]),
])
def test_channels_last_update_errors(case, exc, words):
    args = dict(x=jnp.ones((2, 3, 8)), conv_state=jnp.ones((2, 3, 8)), weight=jnp.ones((8, 4)),
                channels_last=True)
    args.update(case)
    with pytest.raises(exc) as e:
        jcc.causal_conv1d_update(args.pop("x"), args.pop("conv_state"), args.pop("weight"),
                                 **args)
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    with pytest.raises(TypeError, match="channels_last"):
        jcc.causal_conv1d_varlen_states(jnp.ones((3, 2)), jnp.asarray([0, 3], jnp.int32), 2,
                                        channels_last="yes")


@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("G", [1, 2])
def test_xla_twins_match_the_kernels_in_both_layouts(cl, G):
    """The pure-XLA twins (what TPU/ROCm run) in the kernels' convention,
    including weight groups (a vmapped weight), against the FFI calls."""
    from jax_causal_conv._lowering import ffi_calls, xla_twins
    from jax_causal_conv._lowering.config import UpdateConfig
    rng = np.random.default_rng(G + 2 * cl)
    B, D, S, W, N, SL = 4, 8, 3, 4, 6, 6
    x = rand(rng, (B, S, D) if cl else (B, D, S))
    st = rand(rng, (N, SL, D) if cl else (N, D, SL))
    w, b = rand(rng, (G, D, W)), rand(rng, (G, D))
    cs = jnp.asarray([0, 3, 8, 1], jnp.int32)
    # with groups, rows of group g use slots of block g (batching.py's layout)
    idx = jnp.asarray([2, -1, 3, 5] if G == 2 else [5, -1, 0, 2], jnp.int32)
    cfg = UpdateConfig(activation="silu", backend="auto", channels_last=cl)
    # (groups come only from vmap, whose rule always passes slot indices)
    for kw in [(cs, idx), (None, idx)] + ([(None, None), (cs, None)] if G == 1 else []):
        want = ffi_calls.update(cfg, x, st, w, b, *kw)
        got = xla_twins.update(cfg, x, st, w, b, *kw)
        close(got[0], want[0], jnp.float32)
        np.testing.assert_array_equal(got[1], want[1])
    xt = rand(rng, (9, D))
    cu = jnp.asarray([0, 2, 2, 9], jnp.int32)
    np.testing.assert_array_equal(xla_twins.varlen_states(5, xt, cu, channels_last=cl),
                                  ffi_calls.varlen_states(5, xt, cu, channels_last=cl))


@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("circular", [False, True])
def test_empty_steps_and_batches(cl, circular):
    """S = 0 tokens or B = 0 rows: empty outputs, the state unchanged."""
    rng = np.random.default_rng(0)
    D, W, SL = 4, 3, 4
    st = rand(rng, (2, SL, D) if cl else (2, D, SL))
    w = rand(rng, (D, W))
    for B, S in [(2, 0), (0, 2)]:
        x = jnp.zeros((B, S, D) if cl else (B, D, S))
        kw = dict(cache_seqlens=jnp.ones((B,), jnp.int32)) if circular else {}
        idx = jnp.zeros((0,), jnp.int32) if B == 0 else None
        y, ns = jcc.causal_conv1d_update(x, st, w, channels_last=cl, conv_state_indices=idx, **kw)
        assert y.shape == x.shape
        np.testing.assert_array_equal(ns, st)
