"""causal_conv1d under plain jit with sharded inputs, on 8 virtual CPU devices.

Every case places x (and residual, seq_idx, initial states) on a mesh, calls
the PUBLIC function under jax.jit, and checks: forward and gradients equal
the unsharded call; outputs keep x's sharding; the compiled HLO has exactly
the expected collectives (none for batch/channel splits except the one
reduction of d(weight), d(bias); for a sequence split the W-1 halo
collective-permute and its reverse, all-reduces only of weight gradients and
(rows, D, W-1) states) and never an all-gather. Both XLA's automatic
propagation (Auto mesh axes) and JAX's explicit-sharding mode."""

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_causal_conv as jcc
from jax_causal_conv.sharding import ShardingFallbackWarning
import oracle
from sharding_helpers import PLATFORM, close, collectives, compiled, mesh, \
    no_gathers, pairs, put

rng = np.random.default_rng(0)


def rand(shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape), dtype)


def _kernels_have_spec_seq_idx():
    """The SPEC's seq_idx semantics (padding, states) landed in the kernels?"""
    try:
        x = jnp.ones((1, 1, 3))
        y, fin = jcc.causal_conv1d(x, jnp.ones((1, 2)), jnp.ones((1,)), seq_idx=jnp.asarray(
            [[0, 0, -1]], jnp.int32), initial_states=jnp.full((1, 1, 1), 5.0),
            return_final_states=True)
    except (ValueError, TypeError):
        return False
    return float(y[0, 0, 2]) == 0.0 and float(fin[0, 0, 0]) == 1.0


NEW_SEQ_IDX = _kernels_have_spec_seq_idx()
needs_new_seq_idx = pytest.mark.skipif(
    not NEW_SEQ_IDX, reason="needs seq_idx padding + initial/final states in the kernels")


def _n(m, axes):
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return int(np.prod([m.shape[a] for a in axes]))


def run_case(m, ba=None, ca=None, sa=None, *, B=4, D=8, L=32, W=4, cl=False, act="silu",
             init=True, res=False, sidx=None, final=True, dtype=jnp.float32):
    """Sharded vs unsharded forward and gradients; returns the collectives of
    the compiled forward and of the compiled gradient."""
    H = W - 1
    xshape = (B, L, D) if cl else (B, D, L)
    x, w, b = rand(xshape, dtype), rand((D, W)), rand((D,))
    h = rand((B, H, D) if cl else (B, D, H), dtype) if init else None
    r = rand(xshape, dtype) if res else None
    kw = dict(activation=act, channels_last=cl, seq_idx=sidx, return_final_states=final)
    g_y, g_f = rand(xshape), rand((B, H, D) if cl else (B, D, H))

    def f(x, w, b, h, r, s):
        return jcc.causal_conv1d(x, w, b, initial_states=h, residual=r, **dict(kw, seq_idx=s))

    def loss(x, w, b, h, r, s):
        out = f(x, w, b, h, r, s)
        y, fin = out if final else (out, None)
        v = jnp.sum(y.astype(jnp.float32) * g_y)
        return v + (jnp.sum(fin.astype(jnp.float32) * g_f) if final else 0.0)

    xs = P(ba, sa, ca) if cl else P(ba, ca, sa)
    sts = P(ba, None, ca) if cl else P(ba, ca, None)
    args = (put(x, m, xs), put(w, m, P(ca, None)), put(b, m, P(ca)), put(h, m, sts),
            put(r, m, xs), put(sidx, m, P(ba, sa)))
    tol = 2e-5 if dtype == jnp.float32 else 2e-2
    fwd, fwd_hlo = compiled(f, *args)
    got, want = fwd(*args), f(x, w, b, h, r, sidx)
    for g_, w_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        close(g_, w_, tol, "forward")
    y = got[0] if final else got
    assert y.sharding.is_equivalent_to(NamedSharding(m, xs), 3), y.sharding
    if final:
        assert got[1].sharding.is_equivalent_to(NamedSharding(m, sts), 3), got[1].sharding
    argn = tuple(i for i, a in enumerate((x, w, b, h, r)) if a is not None)
    grad, grad_hlo = compiled(jax.grad(loss, argnums=argn), *args)
    want_g = jax.grad(loss, argnums=argn)(x, w, b, h, r, sidx)
    for i, g_, w_ in zip(argn, grad(*args), want_g):
        close(g_, w_, tol * 10, "d" + "x w b init residual".split()[i])
    return collectives(fwd_hlo), collectives(grad_hlo), (x, w, b, h, r, sidx), got


def check_collectives(fwd, bwd, m, ba, ca, sa, *, B=4, D=8, L=32, W=4, cl=False, init=True,
                      final=True, sidx=None, explicit=False):
    """Exactly the collectives the split needs, and nothing gathered."""
    no_gathers(fwd)
    no_gathers(bwd)
    nb, nc, ns = _n(m, ba), _n(m, ca), _n(m, sa)
    Bl, Dl, Ll, H = B // nb, D // nc, L // ns, W - 1
    halo = (Bl, H, Dl) if cl else (Bl, Dl, H)
    split_seq = ns > 1 and H > 0
    hops = -(-H // Ll) if split_seq else 0
    perms = lambda cs, dt: [c for c in cs if c[0] == "collective-permute"  # noqa: E731
                            and (c[1][0][0] == "s32") == (dt == "s32")]
    # forward: the halo of x (and of seq_idx), one hop per block it spans
    assert len(perms(fwd, "f")) == hops, fwd
    assert len(perms(fwd, "s32")) == (hops if sidx is not None else 0), fwd
    assert len(perms(bwd, "s32")) in ((1, 2) if sidx is not None and hops else (0,)) or \
        sidx is not None and hops <= len(perms(bwd, "s32")) <= 2 * hops, bwd
    if hops == 1:
        (p,) = perms(fwd, "f")
        assert p[1][0][1] == halo, (p, halo)
        assert pairs(p[2]) == {(i, i + 1) for i in range(ns - 1)} or ns != m.size
    # forward all-reduces: only the final states (and with seq_idx, which block holds them)
    red = [c for c in fwd if c[0] == "all-reduce"]
    want_red = [halo] if final and split_seq else []
    if final and split_seq and sidx is not None:
        want_red.append((Bl,))
    assert sorted(s for c in red for _, s in c[1]) == sorted(want_red), (red, want_red)
    # backward: d(halo) back, and the halo again (the backward's own exchange;
    # XLA merges it with the forward's, or drops the forward's, in some programs)
    if hops == 1:
        back = [c for c in perms(bwd, "f") if all(j == i - 1 for i, j in pairs(c[2]))]
        assert len(back) == 1 and back[0][1][0][1] == halo, bwd
        assert len(perms(bwd, "f")) in (2, 3), bwd
        assert all(c[1][0][1] == halo for c in perms(bwd, "f")), bwd
    elif hops:
        assert 2 * hops <= len(perms(bwd, "f")) <= 3 * hops, bwd
    else:
        assert perms(bwd, "f") == perms(bwd, "s32") == [], bwd
    # backward all-reduces: d(weight) and d(bias) over the row/sequence splits,
    # d(initial states) over the sequence split, with seq_idx which block holds
    # the final states; the forward's hand-out of the final states if the
    # gradient program still needs their value
    shapes = Counter(s for c in bwd if c[0] == "all-reduce" for _, s in c[1])
    want = Counter()
    if nb * ns > 1:
        want.update([(1, Dl, W), (1, Dl)])
    if init and split_seq:
        want[halo] += 1
    optional = Counter()
    if final and split_seq:
        optional[halo] += 1
        if sidx is not None:
            want[(Bl,)] += 1
            optional[(Bl,)] += 1
    if PLATFORM == "gpu":  # XLA:GPU combines all-reduces into flat buffers: count elements
        size = lambda c: sum(int(np.prod(s)) * k for s, k in c.items())  # noqa: E731
        assert size(want) <= size(shapes) <= size(want + optional), (shapes, want, optional)
    else:
        assert not want - shapes and not shapes - want - optional, (shapes, want, optional)


def sorted_ids(B, L, n=4):
    return jnp.asarray(np.sort(rng.integers(0, n, (B, L)), axis=1), jnp.int32)


# (mesh shape, names, batch/channel/sequence axes, case options)
CASES = {
    "batch": ((4,), ("b",), ("b", None, None), dict(B=8)),
    "channel_cl": ((4,), ("c",), (None, "c", None), dict(cl=True)),
    "seq": ((8,), ("s",), (None, None, "s"), dict(L=64)),
    "seq_cl_residual": ((4,), ("s",), (None, None, "s"), dict(cl=True, res=True, act=None)),
    "batch_x_seq": ((2, 4), ("b", "s"), ("b", None, "s"), {}),
    "channel_x_seq_cl": ((2, 4), ("c", "s"), (None, "c", "s"), dict(cl=True)),
    "b_c_s_seqidx": ((2, 2, 2), ("b", "c", "s"), ("b", "c", "s"),
                     dict(sidx=True, init=False, final=False)),
    "seq_seqidx_cl_residual": ((8,), ("s",), (None, None, "s"),
                               dict(sidx=True, cl=True, res=True, init=False, final=False)),
    "seq_short_blocks_3hops": ((8,), ("s",), (None, None, "s"), dict(L=16, W=6)),
    "seq_seqidx_2hops": ((8,), ("s",), (None, None, "s"),
                         dict(L=16, W=5, sidx=True, init=False, final=False)),
    "seq_width1": ((4,), ("s",), (None, None, "s"), dict(W=1)),
    "seq_noinit_nofinal": ((8,), ("s",), (None, None, "s"), dict(init=False, final=False)),
    "seq_over_two_axes": ((2, 4), ("x", "y"), (None, None, ("x", "y")), {}),
    "seq_bf16": ((4,), ("s",), (None, None, "s"), dict(dtype=jnp.bfloat16)),
    "seq_unused_axis": ((2, 4), ("r", "s"), (None, None, "s"), {}),
}
EXPLICIT = ["batch", "seq", "channel_x_seq_cl", "b_c_s_seqidx", "seq_short_blocks_3hops"]


@pytest.mark.parametrize("name,explicit", [(c, False) for c in CASES] +
                         [(c, True) for c in EXPLICIT])
def test_conv_partitions_itself(name, explicit):
    shape, names, (ba, ca, sa), opts = CASES[name]
    m = mesh(shape, names, explicit)
    opts = dict(opts)
    if opts.get("sidx"):
        opts["sidx"] = sorted_ids(opts.get("B", 4), opts.get("L", 32))
    fwd, bwd, *_ = run_case(m, ba, ca, sa, **opts)
    keep = {k: v for k, v in opts.items() if k in ("B", "D", "L", "W", "cl", "init", "final",
                                                   "sidx")}
    check_collectives(fwd, bwd, m, ba, ca, sa, explicit=explicit, **keep)


def padded_ids(B, L):
    """Packed sequences with ids that are neither sorted nor from 0, padding
    (-1) at the end, in the middle and at the start, and a row of padding only."""
    s = np.sort(rng.integers(0, 3, (B, L)), axis=1) * 7 + 5
    s[0, -5:] = -1
    s[1, L // 2 - 1: L // 2 + 2] = -1
    s[1, L // 2 + 2:] = s[1, 0]          # the first id again, after the gap
    s[2, :] = -1
    s[3, :2] = -1                        # the initial states belong to no sequence
    return jnp.asarray(s, jnp.int32)


@needs_new_seq_idx
@pytest.mark.parametrize("split,explicit", [("seq", False), ("seq", True), ("batch", False),
                                            ("seq_short", False), ("seq_cl", False)])
def test_seq_idx_padding_and_states_across_blocks(split, explicit):
    """SPEC seq_idx: padding, initial states for the first segment, final
    states of the last segment, whichever block they fall in."""
    B, D, L, W = 4, 8, 32, 4
    if split == "seq_short":
        L, W = 16, 5
    cl = split == "seq_cl"
    m = mesh((8,) if split != "batch" else (4,), ("a",), explicit)
    axes = ("a", None, None) if split == "batch" else (None, None, "a")
    s = padded_ids(B, L)
    fwd, bwd, (x, w, b, h, r, _), got = run_case(m, *axes, B=B, D=D, L=L, W=W, sidx=s,
                                                 res=True, cl=cl)
    t = (lambda a: np.swapaxes(np.asarray(a), 1, 2)) if cl else np.asarray
    y0, f0 = oracle.conv(t(x), w, b, "silu", t(r), seq_idx=s, init=t(h))
    close(t(got[0]), y0, 2e-5, "y vs SPEC oracle")
    close(t(got[1]), f0, 2e-5, "final states vs SPEC oracle")
    check_collectives(fwd, bwd, m, *axes, B=B, D=D, L=L, W=W, sidx=s, cl=cl, explicit=explicit)


@pytest.fixture
def xla_twins_only(monkeypatch):
    """As on a platform without our kernels (TPU, ROCm): every call runs the
    pure-XLA twin, inside the same per-device programs."""
    from jax_causal_conv._lowering import targets
    jax.clear_caches()
    monkeypatch.setattr(targets, "PLATFORMS", ())
    yield
    jax.clear_caches()


def test_the_xla_twin_partitions_the_same_way(xla_twins_only):
    m = mesh((2, 4), ("b", "s"))
    fwd, bwd, args, _ = run_case(m, "b", None, "s", D=6, L=32, sidx=padded_ids(4, 32))
    check_collectives(fwd, bwd, m, "b", None, "s", D=6, L=32, sidx=True)
    x = put(args[0], m, P("b", None, "s"))
    _, hlo = compiled(lambda x: jcc.causal_conv1d(x, args[1], seq_idx=args[5]), x)
    assert "custom_call_target=\"jax_causal_conv" not in hlo and "collective-permute" in hlo


def test_oracle_agrees_with_reference_without_padding():
    """The oracle's seq_idx semantics on sorted ids without padding or states
    are the package's (so the test above can fail only on new semantics)."""
    x, w = rand((2, 3, 12)), rand((3, 4))
    s = sorted_ids(2, 12)
    close(jcc.causal_conv1d(x, w, seq_idx=s), oracle.conv(x, w, seq_idx=s)[0], 2e-5)


def test_uneven_split_warns_and_gathers():
    """A sequence split that does not divide L (XLA propagates one onto a
    slice of a split array): said, and still correct."""
    m = mesh((4,), ("s",))
    x, w = rand((2, 4, 32)), rand((4, 4))
    xs = jax.device_put(x, NamedSharding(m, P(None, None, "s")))
    f = jax.jit(lambda x: jcc.causal_conv1d(x[..., :30], w))
    with pytest.warns(ShardingFallbackWarning, match="sequence length of size 30"):
        y = f(xs)
    close(y, jcc.causal_conv1d(x[..., :30], w), 2e-5)


def test_mixed_explicit_and_auto_mesh_warns():
    from jax.sharding import AxisType, Mesh
    from sharding_helpers import devices
    mesh((2, 4), ("b", "s"))  # (skips without 8 devices)
    m = Mesh(np.array(devices()[:8]).reshape(2, 4), ("b", "s"),
             axis_types=(AxisType.Explicit, AxisType.Auto))
    x, w = rand((4, 8, 32)), rand((8, 4))
    with pytest.warns(ShardingFallbackWarning, match="mixes Explicit and other axes"):
        y = jax.jit(lambda x: jcc.causal_conv1d(x, w))(put(x, m, P("b", None, "s")))
    close(y, jcc.causal_conv1d(x, w), 2e-5)


def test_vmap_keeps_the_inner_batch_split():
    """vmap over a leading axis of a batch-split x: still one kernel call per
    device, no gather (the mapped axis is folded into the batch per block)."""
    m = mesh((4,), ("b",))
    x, w, h = rand((3, 8, 4, 16)), rand((4, 4)), rand((3, 8, 4, 3))
    spec = P(None, "b", None, None)
    args = (put(x, m, spec), put(h, m, spec))
    f = jax.vmap(lambda x, h: jcc.causal_conv1d(x, w, initial_states=h, activation="silu"))
    c, hlo = compiled(f, *args)
    close(c(*args), f(x, h), 2e-5, "vmap")
    assert c(*args).sharding.is_equivalent_to(NamedSharding(m, spec), 4)
    assert collectives(hlo) == []
    assert hlo.count("custom_call_target=\"jax_causal_conv_fwd") == 1
    # grad of vmap: the weight's gradient is summed once over the batch split
    loss = lambda x, w: jnp.sum(jax.vmap(  # noqa: E731
        lambda x: jcc.causal_conv1d(x, w, activation="silu"))(x) ** 2)
    c, hlo = compiled(jax.grad(loss, (0, 1)), args[0], w)
    for a, e in zip(c(args[0], w), jax.grad(loss, (0, 1))(x, w)):
        close(a, e, 2e-4, "grad of vmap")
    no_gathers(collectives(hlo))
    assert [c_[0] for c_ in collectives(hlo)] == ["all-reduce"]


def test_vmap_over_a_split_axis_with_split_sequence():
    m = mesh((2, 4), ("v", "s"))
    x, w = rand((2, 3, 4, 32)), rand((4, 4))
    xs = put(x, m, P("v", None, None, "s"))
    f = jax.vmap(lambda x: jcc.causal_conv1d(x, w))
    c, hlo = compiled(f, xs)
    close(c(xs), f(x), 2e-5)
    colls = collectives(hlo)  # each block: its 3 rows' halo of W-1 = 3 steps
    assert [(k, s[0][1]) for k, s, _ in colls] == [("collective-permute", (3, 4, 3))], colls
