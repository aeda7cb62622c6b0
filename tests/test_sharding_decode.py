"""causal_conv1d_update, causal_conv1d_varlen and causal_conv1d_varlen_states
under plain jit with sharded inputs (8 virtual CPU devices): results equal
the unsharded calls, and the compiled HLO has only the expected collectives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_causal_conv as jcc
from jax_causal_conv.sharding import ShardingFallbackWarning
from sharding_helpers import close, collectives, compiled, mesh, no_gathers, put

rng = np.random.default_rng(1)


def rand(shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape), dtype)


B, D, N, SL, W = 4, 8, 8, 5, 4


def _update_args(S=2):
    x, st, w, b = rand((B, D, S)), rand((N, D, SL)), rand((D, W)), rand((D,))
    idx = jnp.asarray([1, 3, 4, 7], jnp.int32)         # row k uses a slot of block k (of 4)
    cache = jnp.asarray([0, 3, 7, 12], jnp.int32)
    return x, st, w, b, cache, idx


def _update(x, st, w, b, c, i):
    return jcc.causal_conv1d_update(x, st, w, b, activation="silu", cache_seqlens=c,
                                    conv_state_indices=i)


@pytest.mark.parametrize("explicit", [False, True])
def test_update_rows_and_slots_split_alike_run_locally_in_place(explicit):
    m = mesh((4, 2), ("b", "c"), explicit)
    x, st, w, b, cache, idx = _update_args()
    specs = (P("b", "c", None), P("b", "c", None), P("c", None), P("c"), P("b"), P("b"))
    args = [put(a, m, s) for a, s in zip((x, st, w, b, cache, idx), specs)]
    c, hlo = compiled(_update, *args, donate_argnums=1)
    y0, st0 = _update(x, st, w, b, cache, idx)
    y, st2 = c(*args)
    close(y, y0, 2e-5, "y")
    close(st2, st0, 2e-5, "state")
    assert collectives(hlo) == []
    assert st2.sharding.is_equivalent_to(NamedSharding(m, specs[1]), 3)
    assert y.sharding.is_equivalent_to(NamedSharding(m, specs[0]), 3)
    # the state buffer is the result's (donated: updated in place)
    assert "input_output_alias={ {1}: (1, {}, must-alias) }" in hlo or \
        "input_output_alias={ {1}: (1, {}, may-alias) }" in hlo, hlo[:600]
    # a row pointing into another block's slots is a padding row
    bad = put(jnp.asarray([1, 0, 4, 7], jnp.int32), m, P("b"))
    args[1] = put(st, m, specs[1])
    y, st2 = jax.jit(_update)(*args[:5], bad)
    y0, st0 = _update(x, st, w, b, cache, jnp.asarray([1, -1, 4, 7], jnp.int32))
    close(y, y0, 2e-5, "y (off-block row)")
    close(st2, st0, 2e-5, "state (off-block row)")


def test_update_one_token_no_indices_one_slot_per_row():
    m = mesh((4,), ("b",))
    x, st, w = rand((B, D)), rand((B, D, SL)), rand((D, W))
    args = (put(x, m, P("b", None)), put(st, m, P("b", None, None)))
    f = lambda x, st: jcc.causal_conv1d_update(x, st, w)  # noqa: E731
    c, hlo = compiled(f, *args)
    for a, e in zip(c(*args), f(x, st)):
        close(a, e, 2e-5)
    assert collectives(hlo) == []


def test_update_slots_split_rows_whole_sums_outputs():
    """Rows on every device, slots split: each device serves the rows whose
    slot it holds (any slot numbering), one all-reduce of y."""
    m = mesh((4,), ("n",))
    x, st, w, b, cache, _ = _update_args(S=1)
    idx = jnp.asarray([6, 0, 5, -1], jnp.int32)
    args = (x, put(st, m, P("n", None, None)), w, b, cache, idx)
    c, hlo = compiled(_update, *args)
    for a, e in zip(c(*args), _update(x, st, w, b, cache, idx)):
        close(a, e, 2e-5)
    colls = collectives(hlo)
    assert [(k, s[0][1]) for k, s, _ in colls] == [("all-reduce", (B, D, 1))], colls


def test_update_rows_split_state_whole_warns():
    m = mesh((4,), ("b",))
    x, st, w, b, cache, idx = _update_args()
    args = (put(x, m, P("b", None, None)), st, w, b, put(cache, m, P("b")), idx)
    with pytest.warns(ShardingFallbackWarning, match="rows are gathered"):
        out = jax.jit(_update)(*args)
    for a, e in zip(out, _update(x, st, w, b, cache, idx)):
        close(a, e, 2e-5)


def test_vmapped_update_with_split_slots():
    m = mesh((2, 4), ("v", "b"))
    x, st, w, b, cache, idx = _update_args()
    xs, sts = jnp.stack([x, 2 * x]), jnp.stack([st, -st])
    f = jax.vmap(_update, in_axes=(0, 0, None, None, None, None))
    args = (put(xs, m, P("v", "b", None, None)), put(sts, m, P("v", "b", None, None)), w, b,
            put(cache, m, P("b")), put(idx, m, P("b")))
    c, hlo = compiled(f, *args)
    for a, e in zip(c(*args), f(xs, sts, w, b, cache, idx)):
        close(a, e, 2e-5)
    assert collectives(hlo) == []


T = 24
CU = jnp.asarray([0, 3, 11, 24], jnp.int32)


@pytest.mark.parametrize("explicit", [False, True])
def test_varlen_channel_split_runs_locally(explicit):
    m = mesh((4,), ("c",), explicit)
    x, w, b, h = rand((T, D)), rand((D, W)), rand((D,)), rand((3, D, W - 1))
    args = (put(x, m, P(None, "c")), put(w, m, P("c", None)), put(b, m, P("c")),
            put(h, m, P(None, "c", None)))
    f = lambda x, w, b, h: jcc.causal_conv1d_varlen(  # noqa: E731
        x, w, b, cu_seqlens=CU, initial_states=h, return_final_states=True, activation="silu")
    loss = lambda *a: sum(jnp.sum(jnp.sin(o)) for o in f(*a))  # noqa: E731
    c, hlo = compiled(f, *args)
    for a, e in zip(c(*args), f(x, w, b, h)):
        close(a, e, 2e-5, "varlen")
    assert collectives(hlo) == []
    g, hlo = compiled(jax.grad(loss, (0, 1, 2, 3)), *args)
    for a, e in zip(g(*args), jax.grad(loss, (0, 1, 2, 3))(x, w, b, h)):
        close(a, e, 2e-4, "varlen grad")
    assert collectives(hlo) == []


CUS = {"cu": CU, "boundaries_and_empty": jnp.asarray([0, 6, 6, 12, 13, 24], jnp.int32),
       "one_long": jnp.asarray([0, 1, 24], jnp.int32)}


@pytest.mark.parametrize("cu_name,n_tok,explicit", [("cu", 4, False), ("cu", 4, True),
                                                    ("boundaries_and_empty", 4, False),
                                                    ("one_long", 8, False)])
def test_varlen_token_split_exchanges_a_halo(cu_name, n_tok, explicit):
    """Tokens split: sequences crossing a block boundary get their history
    from the halo (and their initial states before their start), final
    states come from the block holding each sequence's last token."""
    cu = CUS[cu_name]
    Ns = len(cu) - 1
    m = mesh((n_tok,), ("t",), explicit)
    x, w, b, h = rand((T, D)), rand((D, W)), rand((D,)), rand((Ns, D, W - 1))
    f = lambda x, w, b, h: jcc.causal_conv1d_varlen(  # noqa: E731
        x, w, b, cu_seqlens=cu, initial_states=h, return_final_states=True, activation="silu")
    loss = lambda *a: sum(jnp.sum(jnp.sin(o)) for o in f(*a))  # noqa: E731
    args = (put(x, m, P("t", None)), w, b, h)
    c, hlo = compiled(f, *args)
    for a, e in zip(c(*args), f(x, w, b, h)):
        close(a, e, 2e-5, "varlen, tokens split")
    Tl, H = T // n_tok, W - 1
    colls = collectives(hlo)
    no_gathers(colls)
    hops = -(-H // Tl)
    assert sorted(s[0][1] for k, s, _ in colls if k == "collective-permute") == \
        sorted([(1, min(H, Tl), D)] * (hops - 1) + [(1, H - (hops - 1) * Tl, D)]), colls
    assert [s for k, s, _ in colls if k == "all-reduce"] == [[("f32", (Ns, D, H))]], colls
    g, hlo = compiled(jax.grad(loss, (0, 1, 2, 3)), *args)
    for a, e in zip(g(*args), jax.grad(loss, (0, 1, 2, 3))(x, w, b, h)):
        close(a, e, 2e-4, "varlen grad, tokens split")
    no_gathers(collectives(hlo))


@pytest.mark.parametrize("split", ["channel", "token", "token_cl"])
def test_varlen_states(split):
    m = mesh((4,), ("a",))
    x = rand((T, D))
    spec = P(None, "a") if split == "channel" else P("a", None)
    cu = CU if split != "token_cl" else jnp.asarray([0, 5, 6, 6, 24], jnp.int32)
    f = lambda x: jcc.causal_conv1d_varlen_states(x, cu, SL + 3)  # noqa: E731
    c, hlo = compiled(f, put(x, m, spec))
    close(c(put(x, m, spec)), f(x), 0, "varlen_states")
    colls = collectives(hlo)
    if split == "channel":
        assert colls == []
    else:  # each device fills in the positions it holds; one sum of the states
        assert [(k, s[0][1]) for k, s, _ in colls] == [("all-reduce", (len(cu) - 1, D, SL + 3))]
    no_gathers(colls)
