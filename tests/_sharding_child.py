"""Sharding checks, run by tests/test_sharding.py in a fresh process with 8 virtual
CPU devices (the XLA flag must precede jax's backend initialisation).

Prints one line per case, ``CASE <name> OK`` or ``CASE <name> FAIL <reason>``,
then ``DONE``. Every case compares the sharded call with the unsharded one
(forward and gradients) and asserts the collectives in the compiled HLO."""

import os
import re
import sys
import traceback

# JCC_SHARDING_PLATFORM=gpu: the real local GPUs instead (cases whose mesh
# needs more devices than there are report SKIP).
ON_GPU = os.environ.get("JCC_SHARDING_PLATFORM") == "gpu"
if not ON_GPU:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_causal_conv as jcc  # noqa: E402
from jax_causal_conv import sharding as S  # noqa: E402

assert ON_GPU or jax.device_count() == 8, jax.devices()
NDEV = jax.device_count()


class Skip(Exception):
    """A case whose mesh needs more devices than this process has."""
rng = np.random.default_rng(0)
CASES = []


def case(fn, name=None):
    if name:
        fn.__name__ = name
    CASES.append(fn)
    return fn


def mesh_of(shape, names):
    if int(np.prod(shape)) > NDEV:
        raise Skip(f"needs {int(np.prod(shape))} devices")
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


def rand(shape, dtype=jnp.float32):
    return jnp.asarray(rng.standard_normal(shape), dtype)


def put(a, mesh, spec):
    return None if a is None else jax.device_put(a, NamedSharding(mesh, spec))


# --- HLO collectives ----------------------------------------------------------------

COLL = re.compile(r"= (.+?) (all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)"
                  r"(?:-start)?\((.*)$")
SHAPE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")


def collectives(hlo):
    """[(kind, [(dtype, shape), ...], attrs)] for every collective in compiled HLO,
    with its result shapes (on GPU, a collective-permute-start's tuple starts with
    the operand's)."""
    out = []
    for line in hlo.splitlines():
        m = COLL.search(line)
        if m:
            shapes = [(d, tuple(int(v) for v in s.split(",") if v)) for d, s in
                      SHAPE.findall(m.group(1))]
            out.append((m.group(2), shapes, m.group(3)))
    return out


def pairs(attrs):
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", attrs)
    return {tuple(int(v) for v in p.split(",")) for p in re.findall(r"\{(\d+,\d+)", m.group(0))}


def group_size(attrs, everyone):
    """Devices per replica group; `everyone` when the groups are left implicit."""
    m = re.search(r"replica_groups=\{\{([0-9,]*)\}", attrs)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", attrs)
    return int(m.group(2)) if m else everyone


def hlo_of(f, *args):
    return jax.jit(f).lower(*args).compile().as_text()


def close(a, b, tol=2e-5, what=""):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shape {a.shape} != {b.shape}")
    err = np.max(np.abs(a - b)) if a.size else 0.0
    if not err <= tol * (1 + np.max(np.abs(b), initial=0.0)):
        raise AssertionError(f"{what}: max abs err {err}")


# --- causal_conv1d_sharded -------------------------------------------------------------

def conv_case(mesh, ba=None, ca=None, sa=None, *, B=4, D=8, L=32, W=4, cl=False, act="silu",
              init=True, res=False, sidx=False, final=True, dtype=jnp.float32):
    """Sharded vs unsharded: forward, grads (x, w, b, init, residual), and collectives."""
    H = W - 1
    xshape = (B, L, D) if cl else (B, D, L)
    x, w, b = rand(xshape, dtype), rand((D, W)), rand((D,))
    h = rand((B, H, D) if cl else (B, D, H), dtype) if init else None
    r = rand(xshape, dtype) if res else None
    s = jnp.asarray(np.sort(rng.integers(0, 4, (B, L)), axis=1), jnp.int32) if sidx else None
    kw = dict(activation=act, channels_last=cl, seq_idx=s, return_final_states=final)
    g_y = rand(xshape)
    g_f = rand((B, H, D) if cl else (B, D, H))

    def loss(fn):
        def f(x, w, b, h, r):
            out = fn(x, w, b, initial_states=h, residual=r, **kw)
            y, fin = out if final else (out, None)
            v = jnp.sum(y.astype(jnp.float32) * g_y)
            return v + (jnp.sum(fin.astype(jnp.float32) * g_f) if final else 0.0)
        return f

    def sharded(x, w, b, **k):
        return S.causal_conv1d_sharded(x, w, b, mesh=mesh, batch_axis=ba, channel_axis=ca,
                                       seq_axis=sa, **k)

    xs = P(ba, sa, ca) if cl else P(ba, ca, sa)
    sts = P(ba, None, ca) if cl else P(ba, ca, None)
    args = (put(x, mesh, xs), put(w, mesh, P(ca, None)), put(b, mesh, P(ca)),
            put(h, mesh, sts), put(r, mesh, xs))
    tol = 2e-5 if dtype == jnp.float32 else 2e-2
    # forward
    got = jax.jit(lambda x, w, b, h, r: sharded(x, w, b, initial_states=h, residual=r, **kw))(
        *args)
    want = jcc.causal_conv1d(x, w, b, initial_states=h, residual=r, **kw)
    for g_, w_ in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        close(g_, w_, tol, "forward")
    if final:
        assert got[1].sharding.is_equivalent_to(NamedSharding(mesh, sts), 3), got[1].sharding
    # gradients
    argn = tuple(i for i, a in enumerate((x, w, b, h, r)) if a is not None)
    gf = jax.grad(loss(sharded), argnums=argn)
    got_g = jax.jit(gf)(*args)
    want_g = jax.grad(loss(jcc.causal_conv1d), argnums=argn)(x, w, b, h, r)
    names = "x w b init residual".split()
    for i, g_, w_ in zip(argn, got_g, want_g):
        close(g_, w_, tol * 10, "d" + names[i])

    # collectives
    n = lambda a: int(np.prod([mesh.shape[k] for k in ((a,) if isinstance(a, str) else a)])) \
        if a else 1  # noqa: E731
    nb, nc, ns = n(ba), n(ca), n(sa)
    Bl, Dl, Ll = B // nb, D // nc, L // ns
    halo = (Bl, H, Dl) if cl else (Bl, Dl, H)
    fwd = collectives(hlo_of(lambda x, w, b, h, r: sharded(
        x, w, b, initial_states=h, residual=r, **kw), *args))
    bwd = collectives(hlo_of(gf, *args))
    hops = -(-H // Ll) if ns > 1 and H else 0
    if ns == 1 or H == 0:
        assert fwd == [], fwd
        assert not [c for c in bwd if c[0] != "all-reduce"], bwd
    else:
        perms = [c for c in fwd if c[0] == "collective-permute"]
        xperm = [c for c in perms if c[1][0][0] != "s32"]
        assert len(xperm) == hops, fwd
        if hops == 1:
            assert xperm[0][1][0][1] == halo, (xperm, halo)
            assert pairs(xperm[0][2]) == {(i, i + 1) for i in range(ns - 1)} or ns != mesh.size
        sperm = [c for c in perms if c[1][0][0] == "s32"]
        assert len(sperm) == (hops if sidx else 0), fwd
        if sidx and hops == 1:
            assert sperm[0][1][0][1] == (Bl, H), sperm
        red = [c for c in fwd if c[0] != "collective-permute"]
        if final and sidx:  # which shard holds each row's last valid token: one (Bl,) int32 max
            owner = [c for c in red if [t for t, _ in c[1]] == ["s32"]]
            assert len(owner) == 1 and [s for _, s in owner[0][1]] == [(Bl,)], red
            red = [c for c in red if c is not owner[0]]
        if final:  # the final states, handed from the last shard to all
            assert len(red) == 1 and red[0][0] == "all-reduce", red
            assert ([int(np.prod(s)) for _, s in red[0][1]] == [Bl * H * Dl] if ON_GPU else
                    [s for _, s in red[0][1]] == [(Bl, H, Dl) if cl else (Bl, Dl, H)]), red
            assert group_size(red[0][2], mesh.size) == ns
        else:
            assert red == [], red
        # backward: the forward exchange plus its reverse, nothing else permuted
        bperm = [c for c in bwd if c[0] == "collective-permute"]
        bx = [c for c in bperm if c[1][0][0] != "s32"]
        assert len(bx) == 2 * hops, bwd
        if hops == 1:
            p0, p1 = pairs(bx[0][2]), pairs(bx[1][2])
            assert p1 == {(j, i) for i, j in p0}, (p0, p1)
            assert all(c[1][0][1] == halo for c in bx), bx
    # reductions in the backward: only d(weight), d(bias), d(initial_states)
    # (and none at all when neither batch nor sequence is sharded)
    red = [c for c in bwd if c[0] != "collective-permute"]
    assert all(c[0] == "all-reduce" for c in red), red
    shapes = sorted(s for c in red for _, s in c[1])
    if nb * ns == 1:
        assert red == [], red
    elif ON_GPU:  # XLA:GPU combines the all-reduces into flat buffers: count elements
        want = Dl * W + Dl + (int(np.prod(halo)) if init and ns > 1 and H else 0)
        assert sum(int(np.prod(s)) for s in shapes) == want, (shapes, want)
    else:
        allowed = {(1, Dl, W), (Dl, W), (1, Dl), (Dl,), halo}
        assert set(shapes) <= allowed, (shapes, allowed)
        assert len(shapes) == len(set(shapes)), shapes   # each gradient reduced once
        prods = {int(np.prod(s)) for s in shapes}
        assert Dl * W in prods and Dl in prods, shapes   # dweight, dbias summed
        if init and ns > 1 and H:
            assert int(np.prod(halo)) in prods, shapes   # dinit summed over sequence
    for c in red:
        assert group_size(c[2], mesh.size) in (nb * ns, ns, nb), c
    return fwd, bwd


M8 = lambda n, name: mesh_of((n,), (name,))  # noqa: E731

for n in (2, 4, 8):
    case(lambda n=n: conv_case(M8(n, "b"), ba="b", B=8), f"batch{n}")
    case(lambda n=n: conv_case(M8(n, "c"), ca="c", D=8, cl=True), f"channel{n}_cl")
    case(lambda n=n: conv_case(M8(n, "s"), sa="s", L=32), f"seq{n}")
    case(lambda n=n: conv_case(M8(n, "s"), sa="s", L=32, cl=True, res=True, act=None),
         f"seq{n}_cl_residual")
case(lambda: conv_case(M8(8, "s"), sa="s", L=32, init=False, final=False), "seq8_noinit_nofinal")
# L/8 = 2 < W-1: 3 hops
case(lambda: conv_case(M8(8, "s"), sa="s", L=16, W=6), "seq8_short_shards_3hops")
case(lambda: conv_case(M8(4, "s"), sa="s", L=16, W=1), "seq4_width1")  # W = 1: nothing to exchange
case(lambda: conv_case(M8(4, "s"), sa="s", L=64, init=False, sidx=True), "seq4_seqidx")
case(lambda: conv_case(M8(8, "s"), sa="s", L=32, init=False, sidx=True, cl=True, res=True),
     "seq8_seqidx_cl_residual")
# 2 hops
case(lambda: conv_case(M8(8, "s"), sa="s", L=16, W=5, init=False, sidx=True), "seq8_seqidx_2hops")
case(lambda: conv_case(M8(4, "s"), sa="s", L=64, dtype=jnp.bfloat16), "seq4_bf16")
case(lambda: conv_case(mesh_of((2, 4), ("b", "s")), ba="b", sa="s", B=4, L=32), "batch2_x_seq4")
case(lambda: conv_case(mesh_of((2, 4), ("c", "s")), ca="c", sa="s", D=8, L=32, cl=True),
     "channel2_x_seq4_cl")
case(lambda: conv_case(mesh_of((2, 4), ("b", "c")), ba="b", ca="c", B=4, D=8), "batch2_x_channel4")
case(lambda: conv_case(mesh_of((2, 2, 2), ("b", "c", "s")), ba="b", ca="c", sa="s", B=4, D=8,
                       L=32, sidx=True, init=False), "b2_c2_s2_seqidx")
# seq over 2 axes
case(lambda: conv_case(mesh_of((2, 4), ("x", "y")), sa=("x", "y"), L=32), "seq_over_two_axes")
# "b" unused: replicated
case(lambda: conv_case(mesh_of((2, 4), ("b", "s")), sa="s", L=32), "seq4_unused_axis_replicated")


@case
def vmap_and_grad_of_vmap_compose():
    mesh = M8(4, "s")
    x, w, h = rand((3, 2, 8, 32)), rand((8, 4)), rand((3, 2, 8, 3))
    f = lambda x, h: S.causal_conv1d_sharded(x, w, initial_states=h, mesh=mesh,  # noqa: E731
                                             seq_axis="s", activation="silu")
    g = lambda x, h: jcc.causal_conv1d(x, w, initial_states=h, activation="silu")  # noqa: E731
    close(jax.jit(jax.vmap(f))(x, h), jax.vmap(g)(x, h), what="vmap")
    lf = lambda fn: lambda x, h: jnp.sum(jax.vmap(fn)(x, h) ** 2)  # noqa: E731
    for a, b_ in zip(jax.jit(jax.grad(lf(f), (0, 1)))(x, h), jax.grad(lf(g), (0, 1))(x, h)):
        close(a, b_, 2e-4, "grad of vmap")
    hlo = hlo_of(jax.vmap(f), x, h)
    assert hlo.count('custom_call_target="jax_causal_conv_fwd_v1"') == 1, "one launch"
    perm = [c for c in collectives(hlo) if c[0] == "collective-permute"]
    assert len(perm) == 1 and perm[0][1][0][1] in ((3 * 2, 8, 3), (3, 2, 8, 3)), perm


@case
def explicit_mesh_from_make_mesh():
    mesh = jax.make_mesh((NDEV,), ("s",))   # Explicit axes by default in recent jax
    x, w = rand((2, 4, 64)), rand((4, 4))
    f = lambda x: S.causal_conv1d_sharded(x, w, mesh=mesh, seq_axis="s")  # noqa: E731
    xs = put(x, mesh, P(None, None, "s"))
    close(jax.jit(f)(xs), jcc.causal_conv1d(x, w), what="forward")
    close(f(x), jcc.causal_conv1d(x, w), what="forward, unplaced input")
    c = collectives(hlo_of(f, xs))
    assert [k for k, _, _ in c] == ["collective-permute"] and c[0][1][0][1] == (2, 4, 3), c


@case
def unplaced_inputs_are_resharded():
    mesh = mesh_of((2, 4), ("b", "s"))
    x, w = rand((2, 4, 64)), rand((4, 4))
    y = S.causal_conv1d_sharded(x, w, mesh=mesh, batch_axis="b", seq_axis="s")
    close(y, jcc.causal_conv1d(x, w), what="eager forward")


@case
def errors():
    mesh = mesh_of((2, 4), ("b", "s"))
    x, w = rand((2, 4, 30)), rand((4, 4))
    for kw, msg in [(dict(seq_axis="s"), "length L = 30 is not divisible by 4"),
                    (dict(seq_axis="q"), "no axis 'q'"),
                    (dict(batch_axis="s", seq_axis="s"), "used by both"),
                    (dict(channel_axis="s", seq_axis="b"), "channels D = 6")]:
        kw2 = dict(kw)
        if "channels" in msg:
            x2 = rand((2, 6, 32))
            w2 = rand((6, 4))
        else:
            x2, w2 = x, w
        try:
            S.causal_conv1d_sharded(x2, w2, mesh=mesh, **kw2)
        except ValueError as e:
            assert msg in str(e), (msg, str(e))
        else:
            raise AssertionError(f"no error for {kw}")
    for fn, args in [(S.causal_conv1d_varlen_sharded, dict(cu_seqlens=jnp.array([0, 4]))),
                     (S.causal_conv1d_varlen_states_sharded, dict(cu_seqlens=jnp.array([0, 4]),
                                                                   state_len=3))]:
        try:
            fn(rand((4, 4)), *([] if "state_len" in args else [rand((4, 4))]), mesh=mesh,
               seq_axis="s", **args)
        except NotImplementedError as e:
            assert "channel sharding only" in str(e)
        else:
            raise AssertionError("varlen over tokens must raise")


# --- decode, varlen -----------------------------------------------------------------

@case
def update_batch_and_channel_sharded():
    mesh = mesh_of((4, 2), ("b", "c"))
    B, D, N, SL, W = 4, 8, 8, 5, 4
    x, st, w, b = rand((B, D, 2)), rand((N, D, SL)), rand((D, W)), rand((D,))
    idx = jnp.asarray([1, 3, 4, 7], jnp.int32)             # row k uses a slot of block k
    cache = jnp.asarray([0, 3, 7, 12], jnp.int32)
    args = (put(x, mesh, P("b", "c", None)), put(st, mesh, P("b", "c", None)),
            put(w, mesh, P("c", None)), put(b, mesh, P("c")), put(cache, mesh, P("b")),
            put(idx, mesh, P("b")))
    f = lambda x, st, w, b, c, i: S.causal_conv1d_update_sharded(  # noqa: E731
        x, st, w, b, mesh=mesh, batch_axis="b", channel_axis="c", activation="silu",
        cache_seqlens=c, conv_state_indices=i)
    y, st2 = jax.jit(f, donate_argnums=1)(*args)
    y0, st0 = jcc.causal_conv1d_update(x, st, w, b, activation="silu", cache_seqlens=cache,
                                       conv_state_indices=idx)
    close(y, y0, what="y")
    close(st2, st0, what="state")
    args = args[:1] + (put(st, mesh, P("b", "c", None)),) + args[2:]
    assert collectives(hlo_of(f, *args)) == []
    # a row pointing at another shard's block acts as a padding row
    bad = jnp.asarray([1, 0, 4, 7], jnp.int32)
    y, st2 = jax.jit(f)(*args[:5], put(bad, mesh, P("b")))
    y0, st0 = jcc.causal_conv1d_update(x, st, w, b, activation="silu", cache_seqlens=cache,
                                       conv_state_indices=jnp.asarray([1, -1, 4, 7], jnp.int32))
    close(y, y0, what="y (off-block)")
    close(st2, st0, what="state (off-block)")
    # one token, no indices, one slot per row
    y, st2 = S.causal_conv1d_update_sharded(x[..., 0], st[:4], w, mesh=mesh, batch_axis="b")
    y0, st0 = jcc.causal_conv1d_update(x[..., 0], st[:4], w)
    close(y, y0, what="y (single)")
    close(st2, st0, what="state (single)")


@case
def varlen_channel_sharded():
    mesh = M8(4, "c")
    T, D, W = 20, 8, 4
    cu = jnp.asarray([0, 3, 11, 20], jnp.int32)
    x, w, b, h = rand((T, D)), rand((D, W)), rand((D,)), rand((3, D, W - 1))
    args = (put(x, mesh, P(None, "c")), put(w, mesh, P("c", None)), put(b, mesh, P("c")),
            put(h, mesh, P(None, "c", None)))

    def mk(fn, **k):
        return lambda x, w, b, h: fn(x, w, b, cu_seqlens=cu, initial_states=h,
                                     return_final_states=True, activation="silu", **k)
    f, g = mk(S.causal_conv1d_varlen_sharded, mesh=mesh, channel_axis="c"), \
        mk(jcc.causal_conv1d_varlen)
    for a, e in zip(jax.jit(f)(*args), g(x, w, b, h)):
        close(a, e, what="varlen fwd")
    loss = lambda fn: lambda *a: sum(jnp.sum(o ** 2) for o in fn(*a))  # noqa: E731
    gf = jax.grad(loss(f), (0, 1, 2, 3))
    for a, e in zip(jax.jit(gf)(*args), jax.grad(loss(g), (0, 1, 2, 3))(x, w, b, h)):
        close(a, e, 2e-4, "varlen grad")
    assert collectives(hlo_of(gf, *args)) == []
    vs = jax.jit(lambda x: S.causal_conv1d_varlen_states_sharded(x, cu, 5, mesh=mesh,
                                                                 channel_axis="c"))
    close(vs(args[0]), jcc.causal_conv1d_varlen_states(x, cu, 5), what="varlen_states")
    assert collectives(hlo_of(vs, args[0])) == []


@case
def docs_example_runs():
    import contextlib
    import io
    path = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "sharding.md")
    if not os.path.exists(path):  # an installed test tree without docs
        return
    code = re.search(r"```python\n(.*?)```", open(path).read(), re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/sharding.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "P(None, 'seq', None) True", lines
    assert lines[1] == "['f32[2,3,128]', 'f32[2,3,128]']", lines


if __name__ == "__main__":
    only = sys.argv[1:]
    for i, fn in enumerate(CASES):
        name = getattr(fn, "__name__", "")
        name = f"{i:02d}_{name}" if name != "<lambda>" else f"{i:02d}"
        if only and name not in only:
            continue
        try:
            fn()
            print(f"CASE {name} OK", flush=True)
        except Skip as e:
            print(f"CASE {name} SKIP {e}", flush=True)
        except Exception as e:  # report and go on
            msg = "".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " | ")
            tb = traceback.extract_tb(e.__traceback__)[-1]
            print(f"CASE {name} FAIL line {tb.lineno}: {msg[:1500]}", flush=True)
    print("DONE", flush=True)
