"""How the torch adapter reaches the kernels: the eager shortcuts past the
dispatcher (plain calls, and an autograd.Function under autograd) against
the custom ops (bitwise the same results; the ops' fakes and schemas pass
torch.library.opcheck), and compact arguments (no view ops on the host)
for modules that take them."""

import pytest

torch = pytest.importorskip("torch")

import jax_causal_conv.torch as jt  # noqa: E402
from jax_causal_conv.torch import direct, ops  # noqa: E402
from torch_support import close, compact_args, make_seq_idx, make_x  # noqa: E402,F401


def test_opcheck():
    gen = torch.Generator().manual_seed(4)
    B, D, L, W = 2, 8, 9, 4
    x = torch.randn(B, D, L, generator=gen, requires_grad=True)
    w = torch.randn(D, W, generator=gen, requires_grad=True)
    b = torch.randn(D, generator=gen, requires_grad=True)
    init = torch.randn(B, D, W - 1, generator=gen, requires_grad=True)
    torch.library.opcheck(ops.fwd_op, (x, w, b, None, init, True, 1, False, False))
    xcl = torch.randn(B, L, D, generator=gen).transpose(1, 2).requires_grad_()
    torch.library.opcheck(ops.fwd_op, (xcl, w, None, None, None, True, 0, True, True))
    state = torch.randn(B, D, W - 1, generator=gen)
    torch.library.opcheck(ops.update_op, (torch.randn(B, D, 2, generator=gen), state, w.detach(),
                                          None, 1, None, None, False))
    torch.library.opcheck(ops.update_op, (torch.randn(B, D, generator=gen), state, w.detach(),
                                          b.detach(), 0, torch.tensor([1, 5], dtype=torch.int32),
                                          None, False))
    s = torch.tensor([[0, 0, 1, 1, 1, 1, 2, 2, 2]] * B, dtype=torch.int32)
    torch.library.opcheck(ops.fwd_op, (xcl, w, b, s, None, False, 1, True, True))
    dy = torch.randn(B, D, L, generator=gen)
    torch.library.opcheck(ops.bwd_op, (x.detach(), w.detach(), b.detach(), None, init.detach(), dy,
                                       torch.randn(B, D, W - 1, generator=gen), 1, False, False))
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32)
    torch.library.opcheck(ops.varlen_states_op, (torch.randn(10, D, generator=gen), cu, 4, False))


def test_eager_calls_skip_the_dispatcher_only_when_nothing_needs_it():
    x = torch.randn(2, 3)
    assert direct.path((x, None)) == direct.PLAIN
    assert direct.path((x.clone().requires_grad_(), x)) == direct.AUTOGRAD
    with torch.no_grad():
        assert direct.path((x.clone().requires_grad_(),)) == direct.PLAIN
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        assert direct.path((torch.empty(2, 3),)) == direct.OP
    seen = []
    torch.func.vmap(lambda t: seen.append(direct.path((t,))) or t)(x)
    assert seen == [direct.OP]
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Mode():
        assert direct.path((x,)) == direct.OP


def test_direct_path_matches_the_op_and_keeps_autograd_safety():
    """Same results as through the op; the in-place state update still bumps
    the state's version counter, so a graph that saved the state refuses to
    backpropagate through values the update overwrote."""
    gen = torch.Generator().manual_seed(11)
    x, w, b = torch.randn(2, 8, 16, generator=gen), torch.randn(8, 4, generator=gen), torch.randn(8, generator=gen)
    y_op = ops.fwd_op(x, w, b, None, None, False, 1, False, False)[0]
    assert torch.equal(jt.causal_conv1d_fn(x, w, b, activation="silu"), y_op)
    with torch.no_grad():
        y = jt.causal_conv1d_fn(x.clone().requires_grad_(), w, b, activation="silu")
    assert torch.equal(y, y_op) and not y.requires_grad
    state = torch.randn(2, 8, 3, generator=gen)
    a = torch.randn(2, 8, 3, generator=gen, requires_grad=True)
    loss = (a * state).sum()  # saves state for its backward
    v0 = state._version
    jt.causal_conv1d_update(torch.randn(2, 8, generator=gen), state, w)
    assert state._version > v0
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("mode", ["plain", "states", "seq_idx", "channel_last"])
def test_eager_autograd_path_equals_the_op_path(mode, monkeypatch):
    """Under autograd, eager calls run the kernels inside an autograd.Function
    (no dispatcher); the custom op (used when tracing) gives bitwise the same
    values and gradients, with the same formula."""
    gen = torch.Generator().manual_seed(12)
    B, D, L, W = 2, 8, 13, 4
    x = make_x(B, D, L, torch.float32, "cpu", mode == "channel_last", gen)
    w, b = torch.randn(D, W, generator=gen), torch.randn(D, generator=gen)
    h = make_x(B, D, W - 1, torch.float32, "cpu", True, gen) if mode == "states" else None
    kw = dict(activation="silu", return_final_states=mode == "states")
    if mode == "seq_idx":
        kw["seq_idx"] = make_seq_idx(B, L, "cpu", gen)

    def run():
        ins = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b, h)]
        out = jt.causal_conv1d_fn(ins[0], ins[1], ins[2], initial_states=ins[3], **kw)
        out = out if isinstance(out, tuple) else (out,)
        sum((o.square() * (i + 1)).sum() for i, o in enumerate(out)).backward()
        return [o.detach() for o in out] + [t.grad for t in ins if t is not None]

    real_op = ops.fwd_op
    monkeypatch.setattr(ops, "fwd_op", lambda *a: pytest.fail("the eager path took the op"))
    eager = run()
    monkeypatch.setattr(ops, "fwd_op", real_op)
    monkeypatch.setattr(direct, "path", lambda tensors: direct.OP)
    through_op = run()
    for a, r in zip(eager, through_op):
        assert torch.equal(a, r)


def test_compact_arguments(compact_args):
    """With a module that takes weight (D, W), bias (D,) and one-token x/y
    (B, D), the adapter hands them over as they are (no view ops), forward,
    backward and update; results do not change."""
    gen = torch.Generator().manual_seed(13)
    B, D, L, W = 2, 8, 11, 4
    w, b = torch.randn(D, W, generator=gen), torch.randn(D, generator=gen)
    compact = compact_args.compact_args
    for cl in (False, True):
        x = make_x(B, D, L, torch.float32, "cpu", cl, gen).requires_grad_()
        h = make_x(B, D, W - 1, torch.float32, "cpu", cl, gen)
        wg, bg = w.clone().requires_grad_(), b.clone().requires_grad_()
        y, fs = jt.causal_conv1d_fn(x, wg, bg, initial_states=h, return_final_states=True,
                                    activation="silu")
        (y.square().sum() + fs.sum()).backward()
        xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
        yr, fr = jt.causal_conv1d_ref(xr, wr, br, initial_states=h, return_final_states=True,
                                      activation="silu")
        (yr.square().sum() + fr.sum()).backward()
        close(y, yr, torch.float32)
        close(fs, fr, torch.float32)
        for g, r in ((x.grad, xr.grad), (wg.grad, wr.grad), (bg.grad, br.grad)):
            close(g, r, torch.float32, scale=max(1.0, r.abs().max().item()))
        if compact and hasattr(compact_args.mod, "received"):  # (the spy, not the real module)
            spy = compact_args.mod
            assert spy.received("fwd", 1).dim() == 2 and spy.received("fwd", 2).dim() == 1
            assert spy.received("bwd", 9).dim() == 2 and spy.received("bwd", 10).dim() == 1
    state = torch.randn(B, D, W - 1, generator=gen)
    state_ref = state.clone()
    for xt in (torch.randn(B, D, generator=gen), torch.randn(B, D, 2, generator=gen)):
        y = jt.causal_conv1d_update(xt, state, w, b, activation="silu")
        close(y, jt.causal_conv1d_update_ref(xt, state_ref, w, b, activation="silu"), torch.float32)
        assert y.shape == xt.shape
        if compact and hasattr(compact_args.mod, "received"):
            assert compact_args.mod.received("update", 0).dim() == xt.dim()
            assert compact_args.mod.received("update", 6).dim() == xt.dim()
    torch.testing.assert_close(state, state_ref, rtol=0, atol=0)


def test_serving_under_inference_mode():
    """Decode and prefill under torch.inference_mode (inference tensors have
    no version counter to bump)."""
    gen = torch.Generator().manual_seed(14)
    w = torch.randn(8, 4, generator=gen)
    outer_state = torch.randn(2, 8, 3, generator=gen)
    ref_state = outer_state.clone()
    with torch.inference_mode():
        state = torch.randn(2, 8, 3, generator=gen)
        x = torch.randn(2, 8, generator=gen)
        close(jt.causal_conv1d_update(x, state.clone(), w), jt.causal_conv1d_update_ref(x, state, w),
              torch.float32)
        jt.causal_conv1d_update(x, outer_state, w)
        out = torch.empty(2, 8, 3)
        _, fs = jt.causal_conv1d_fn(torch.randn(2, 8, 5, generator=gen), w, return_final_states=True,
                                    final_states_out=out)
        assert fs is out
    jt.causal_conv1d_update_ref(x, ref_state, w)
    torch.testing.assert_close(outer_state, ref_state, rtol=0, atol=0)
