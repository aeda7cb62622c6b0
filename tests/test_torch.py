"""jax_causal_conv.torch (the Dao-compatible PyTorch adapter) against the
plain-torch references: forward over dtypes x widths x layouts x seq_idx x
states, gradients (and gradcheck in float64), the in-place decode update,
varlen states and torch.compile(fullgraph=True). Skipped without torch; the
CUDA cases (gpu mark) are skipped without a CUDA device and a _jcc_cuda
module that has the DLPack entry points. Dao 1.7 fidelity, bad input and
the dispatcher shortcuts have their own files (test_torch_*.py)."""

import pytest

torch = pytest.importorskip("torch")

import jax_causal_conv.torch as jt  # noqa: E402
from jax_causal_conv.torch.layout import is_channel_last  # noqa: E402
from torch_support import (DEVICES, DTYPES, HAS_CUDA, close, kernels, make_seq_idx,  # noqa: E402
                           make_x, skip_f64_on_gpu)

WIDTHS = [1, 2, 3, 4, 5, 8]


# --- forward --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("W", WIDTHS)
@pytest.mark.parametrize("channel_last", [False, True], ids=["cf", "cl"])
@pytest.mark.parametrize("variant", ["plain", "bias_silu", "seq_idx", "states"])
def test_forward_matches_reference(device, dtype, W, channel_last, variant):
    dtype = DTYPES[dtype]
    skip_f64_on_gpu(device, dtype)
    gen = torch.Generator().manual_seed(W * 7 + channel_last)
    B, D, L = 2, 24, 37
    x = make_x(B, D, L, dtype, device, channel_last, gen)
    assert is_channel_last(x) == channel_last
    w = (torch.randn(D, W, generator=gen) / W**0.5).to(device, dtype)
    b = torch.randn(D, generator=gen).to(device, dtype)
    kw, rkw = {}, {}
    if variant == "bias_silu":
        kw = rkw = dict(bias=b, activation="silu")
    elif variant == "seq_idx":
        s = make_seq_idx(B, L, device, gen)
        kw = rkw = dict(bias=b, seq_idx=s, activation="swish")
    elif variant == "states":
        init = make_x(B, D, W - 1, dtype, device, not channel_last, gen)  # the other layout
        kw = rkw = dict(bias=b, initial_states=init, return_final_states=True)
    out = jt.causal_conv1d_fn(x, w, **kw)
    ref = jt.causal_conv1d_ref(x, w, **rkw)
    if variant == "states":
        (y, fs), (yr, fr) = out, ref
        close(fs, fr, dtype)
        assert fs.shape == (B, D, W - 1)
        # final states follow the initial states' layout
        assert is_channel_last(fs) == (not channel_last) or W <= 2
    else:
        y, yr = out, ref
    close(y, yr, dtype, scale=max(1.0, yr.abs().max().item()))
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    if L > 1 and D > 1:
        assert is_channel_last(y) == channel_last  # the output has x's layout


@pytest.mark.parametrize("device", DEVICES)
def test_final_states_layouts_and_out(device):
    gen = torch.Generator().manual_seed(1)
    B, D, L, W = 3, 16, 5, 4  # L > W-1 and a short case below
    w = torch.randn(D, W, generator=gen).to(device)
    for channel_last in (False, True):
        for L in (5, 2):  # L < W-1: final states include the initial states
            x = make_x(B, D, L, torch.float32, device, channel_last, gen)
            init = torch.randn(B, D, W - 1, generator=gen).to(device)
            y, fs = jt.causal_conv1d_fn(x, w, initial_states=init, return_final_states=True)
            yr, fr = jt.causal_conv1d_ref(x, w, initial_states=init, return_final_states=True)
            close(y, yr, torch.float32)
            close(fs, fr, torch.float32)
            # no initial states: Dao's default layout follows x
            y, fs = jt.causal_conv1d_fn(x, w, return_final_states=True)
            assert is_channel_last(fs) == channel_last
            close(fs, jt.causal_conv1d_ref(x, w, return_final_states=True)[1], torch.float32)
            # final_states_out is written in place and returned, in either layout
            for out_cl in (False, True):
                out = make_x(B, D, W - 1, torch.float32, device, out_cl, gen)
                y2, fs2 = jt.causal_conv1d_fn(x, w, initial_states=init, return_final_states=True,
                                              final_states_out=out)
                assert fs2 is out
                close(out, fr, torch.float32)
    # final_states_out is ignored without return_final_states (Dao)
    x = make_x(B, D, 5, torch.float32, device, False, gen)
    out = torch.zeros(B, D, W - 1, device=device)
    y = jt.causal_conv1d_fn(x, w, final_states_out=out)
    assert isinstance(y, torch.Tensor) and out.abs().max() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_dtypes_and_strided_inputs(device):
    gen = torch.Generator().manual_seed(2)
    B, D, L, W = 2, 32, 40, 4
    x = torch.randn(B, D, L, generator=gen).to(device, torch.bfloat16)
    w = torch.randn(D, W, generator=gen).to(device)  # float32 weight, bf16 x
    b = torch.randn(D, generator=gen).to(device, torch.float16)
    y = jt.causal_conv1d_fn(x, w, b, activation="silu")
    assert y.dtype == torch.bfloat16
    close(y, jt.causal_conv1d_ref(x, w, b, activation="silu"), torch.bfloat16, scale=4)
    # neither layout is dense: copied first, like Dao's x.contiguous()
    big = torch.randn(B, D, 2 * L, generator=gen).to(device)
    xs = big[:, :, ::2]
    assert xs.stride(2) != 1 and xs.stride(1) != 1
    close(jt.causal_conv1d_fn(xs, w), jt.causal_conv1d_ref(xs, w), torch.float32)
    # a channel-last view with padded rows (stride(1) == 1, not dense)
    pad = torch.randn(B, L, D + 8, generator=gen).to(device)[:, :, :D].transpose(1, 2)
    assert is_channel_last(pad)
    close(jt.causal_conv1d_fn(pad, w), jt.causal_conv1d_ref(pad, w), torch.float32)
    # a transposed weight view
    wt = torch.randn(W, D, generator=gen).to(device).T
    close(jt.causal_conv1d_fn(x.float(), wt), jt.causal_conv1d_ref(x.float(), wt), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_dims(device):
    w = torch.randn(8, 4, device=device)
    for shape in [(0, 8, 5), (2, 8, 0)]:
        x = torch.randn(*shape, device=device)
        y, fs = jt.causal_conv1d_fn(x, w, return_final_states=True)
        assert y.shape == shape and fs.shape == (shape[0], 8, 3)
    x = torch.randn(2, 8, 0, device=device)
    init = torch.randn(2, 8, 3, device=device)
    _, fs = jt.causal_conv1d_fn(x, w, initial_states=init, return_final_states=True)
    close(fs, init, torch.float32)


# --- gradients ------------------------------------------------------------------------


def _grads(fn, x, w, b, init, gy, gfs):
    x, w, b = (t.detach().requires_grad_() for t in (x, w, b))
    init = init.detach().requires_grad_() if init is not None else None
    out = fn(x, w, b, init)
    if isinstance(out, tuple):
        loss = (out[0].double() * gy).sum() + (out[1].double() * gfs).sum()
    else:
        loss = (out.double() * gy).sum()
    ins = [x, w, b] + ([init] if init is not None else [])
    return out, torch.autograd.grad(loss, ins)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("W", [1, 2, 4, 5])
@pytest.mark.parametrize("channel_last", [False, True], ids=["cf", "cl"])
@pytest.mark.parametrize("variant", ["silu", "seq_idx", "states"])
def test_gradients_match_reference(device, dtype, W, channel_last, variant):
    dtype = DTYPES[dtype]
    skip_f64_on_gpu(device, dtype)
    gen = torch.Generator().manual_seed(W + 10 * channel_last)
    B, D, L = 2, 20, 33
    x = make_x(B, D, L, dtype, device, channel_last, gen)
    w = (torch.randn(D, W, generator=gen) / W**0.5).to(device, dtype)
    b = torch.randn(D, generator=gen).to(device, dtype)
    gy = torch.randn(B, D, L, generator=gen, dtype=torch.float64).to(device)
    gfs = torch.randn(B, D, W - 1, generator=gen, dtype=torch.float64).to(device)
    init, kw = None, dict(activation="silu")
    if variant == "seq_idx":
        kw["seq_idx"] = make_seq_idx(B, L, device, gen)
    elif variant == "states":
        init = make_x(B, D, W - 1, dtype, device, channel_last, gen)
        kw["return_final_states"] = True

    def ours(x, w, b, init):
        return jt.causal_conv1d_fn(x, w, b, initial_states=init, **kw)

    def ref(x, w, b, init):
        return jt.causal_conv1d_ref(x, w, b, initial_states=init, **kw)

    _, g = _grads(ours, x, w, b, init, gy, gfs)
    _, gr = _grads(ref, x, w, b, init, gy, gfs)
    names = ["dx", "dweight", "dbias", "dinitial_states"]
    for name, a, r in zip(names, g, gr):
        assert a.dtype == r.dtype and a.shape == r.shape, name
        # dweight/dbias sum over B*L terms: scale the tolerance with the magnitude
        close(a, r, dtype, scale=max(1.0, r.abs().max().item()) if r.numel() else 1.0)


def test_gradcheck_float64():
    gen = torch.Generator().manual_seed(3)
    B, D, L, W = 2, 3, 6, 3
    dt = torch.float64
    x = torch.randn(B, D, L, generator=gen, dtype=dt, requires_grad=True)
    w = torch.randn(D, W, generator=gen, dtype=dt, requires_grad=True)
    b = torch.randn(D, generator=gen, dtype=dt, requires_grad=True)
    init = torch.randn(B, D, W - 1, generator=gen, dtype=dt, requires_grad=True)

    def f(x, w, b, init):  # both outputs, so the final-state gradient is checked too
        return jt.causal_conv1d_fn(x, w, b, initial_states=init, return_final_states=True,
                                   activation="silu")

    assert torch.autograd.gradcheck(f, (x, w, b, init))
    xcl = torch.randn(B, L, D, generator=gen, dtype=dt).transpose(1, 2).requires_grad_()
    s = torch.tensor([[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 1]], dtype=torch.int32)
    assert torch.autograd.gradcheck(
        lambda x, w, b: jt.causal_conv1d_fn(x, w, b, seq_idx=s, activation="silu"), (xcl, w, b))


# --- decode -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("W", WIDTHS)
@pytest.mark.parametrize("variant", ["rolling", "circular", "indices"])
def test_update_matches_reference_in_place(device, dtype, W, variant):
    dtype = DTYPES[dtype]
    skip_f64_on_gpu(device, dtype)
    gen = torch.Generator().manual_seed(W)
    B, D, S, SL = 3, 16, 2, W + 1
    w = (torch.randn(D, W, generator=gen) / W**0.5).to(device, dtype)
    b = torch.randn(D, generator=gen).to(device, dtype)
    x = torch.randn(B, D, S, generator=gen).to(device, dtype)
    kw = {}
    slots = B
    if variant == "circular":
        kw["cache_seqlens"] = torch.tensor([0, 3, 11], dtype=torch.int32, device=device)
    elif variant == "indices":
        slots = 5
        kw["conv_state_indices"] = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    state = torch.randn(slots, D, SL, generator=gen).to(device, dtype)
    state_ref = state.clone()
    ptr = state.data_ptr()
    y = jt.causal_conv1d_update(x, state, w, b, activation="silu", **kw)
    yr = jt.causal_conv1d_update_ref(x, state_ref, w, b, activation="silu", **kw)
    close(y, yr, dtype)
    assert state.data_ptr() == ptr
    torch.testing.assert_close(state, state_ref, rtol=0, atol=0)  # a pure copy of inputs
    if variant == "indices":
        assert y[1].abs().max() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_update_single_token_and_strided_state(device):
    gen = torch.Generator().manual_seed(5)
    B, D, W = 2, 8, 4
    w = torch.randn(D, W, generator=gen).to(device)
    x = torch.randn(B, D, generator=gen).to(device)  # (batch, dim): one token
    cache = torch.randn(B, D, 2 * (W - 1), generator=gen).to(device)
    state = cache[:, :, ::2]  # not contiguous: still updated in place
    state_ref = state.clone()
    y = jt.causal_conv1d_update(x, state, w)
    yr = jt.causal_conv1d_update_ref(x, state_ref, w)
    assert y.shape == (B, D)
    close(y, yr, torch.float32)
    close(cache[:, :, ::2], state_ref, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channel_last", [False, True], ids=["cf", "cl"])
def test_prefill_then_decode_equals_full(device, channel_last):
    gen = torch.Generator().manual_seed(6)
    B, D, L, W, P = 2, 16, 12, 4, 7
    x = make_x(B, D, L, torch.float32, device, channel_last, gen)
    w = torch.randn(D, W, generator=gen).to(device)
    b = torch.randn(D, generator=gen).to(device)
    full = jt.causal_conv1d_fn(x, w, b, activation="silu")
    y0, fs = jt.causal_conv1d_fn(x[:, :, :P], w, b, activation="silu", return_final_states=True)
    state = fs.contiguous()
    ys = [y0]
    for t in range(P, L):
        ys.append(jt.causal_conv1d_update(x[:, :, t], state, w, b, activation="silu")[..., None])
    close(torch.cat(ys, dim=-1), full, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_varlen_states(device, dtype):
    dtype = DTYPES[dtype]
    skip_f64_on_gpu(device, dtype)
    gen = torch.Generator().manual_seed(7)
    D = 12
    cu = torch.tensor([0, 5, 5, 6, 20], dtype=torch.int32, device=device)
    x = torch.randn(20, D, generator=gen).to(device, dtype)
    for state_len in (0, 1, 3, 8):
        st = jt.causal_conv1d_varlen_states(x, cu, state_len)
        assert st.shape == (4, D, state_len) and st.dtype == dtype
        torch.testing.assert_close(st, jt.causal_conv1d_varlen_states_ref(x, cu, state_len),
                                   rtol=0, atol=0)
    # int64 offsets are accepted; the states feed a prefill's final states
    st = jt.causal_conv1d_varlen_states(x, cu.long(), 3)
    w = torch.randn(D, 4, generator=gen).to(device, dtype)
    _, fs = jt.causal_conv1d_fn(x[14:20].T[None], w, return_final_states=True)
    torch.testing.assert_close(st[3:4], fs, rtol=0, atol=0)


# --- torch.compile ----------------------------------------------------------------------


def test_compile_fullgraph_forward_backward_and_update():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(8)
    B, D, L, W = 2, 8, 16, 4
    x = torch.randn(B, L, D, generator=gen).transpose(1, 2)
    w = torch.randn(D, W, generator=gen)
    b = torch.randn(D, generator=gen)
    init = torch.randn(B, D, W - 1, generator=gen)

    def f(x, w, b, init):
        y, fs = jt.causal_conv1d_fn(x, w, b, initial_states=init, return_final_states=True,
                                    activation="silu")
        return (y * y).sum() + fs.sum()

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    args = [t.clone().requires_grad_() for t in (x, w, b, init)]
    args_ref = [t.clone().requires_grad_() for t in (x, w, b, init)]
    out = cf(*args)
    out.backward()
    ref = f(*args_ref)
    ref.backward()
    close(out, ref, torch.float32)
    for a, r in zip(args, args_ref):
        close(a.grad, r.grad, torch.float32, scale=max(1.0, r.grad.abs().max().item()))

    def step(x, state, w):  # in-place state update inside a compiled graph
        return jt.causal_conv1d_update(x, state, w, None, "silu") * 2

    cstep = torch.compile(step, fullgraph=True, backend="aot_eager")
    state = torch.randn(B, D, W - 1, generator=gen)
    state_ref = state.clone()
    xt = torch.randn(B, D, generator=gen)
    close(cstep(xt, state, w), step(xt, state_ref, w), torch.float32)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=0)


def test_compile_fullgraph_after_jax_calls():
    """A JAX call first (numpy dtypes meet the validation's dtype names),
    then a fullgraph compile: torch 2.11's dynamo could not hash numpy
    dtype keys in the dict its traced lookup reads (a graph break, an error
    under fullgraph=True). Torch's own dtypes keep a cache of their own."""
    import jax.numpy as jnp

    import jax_causal_conv as jcc
    from jax_causal_conv import validation
    jcc.causal_conv1d(jnp.ones((1, 4, 8), jnp.float32), jnp.ones((4, 3), jnp.float32))
    torch._dynamo.reset()
    x, w = torch.randn(1, 4, 8), torch.randn(4, 3)
    cf = torch.compile(lambda x, w: jt.causal_conv1d_fn(x, w, activation="silu"), fullgraph=True,
                       backend="aot_eager")
    close(cf(x, w), jt.causal_conv1d_fn(x, w, activation="silu"), torch.float32)
    assert validation._TORCH_DTYPE_NAMES and all(isinstance(k, torch.dtype) for k in validation._TORCH_DTYPE_NAMES)
    assert not any(isinstance(k, torch.dtype) for k in validation._NUMPY_DTYPE_NAMES)


@pytest.mark.slow
def test_compile_inductor_forward():
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 8, 16, generator=gen)
    w = torch.randn(8, 4, generator=gen)
    f = torch.compile(lambda x, w: jt.causal_conv1d_fn(x, w, activation="silu") + 1,
                      fullgraph=True)
    close(f(x, w), jt.causal_conv1d_ref(x, w, activation="silu") + 1, torch.float32)


# --- CUDA specifics -----------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and _jcc_cuda with DLPack entry points")
def test_cuda_runs_on_current_stream():
    gen = torch.Generator().manual_seed(10)
    B, D, L, W = 4, 256, 2048, 4
    x = torch.randn(B, L, D, generator=gen).cuda().transpose(1, 2).requires_grad_()
    w = torch.randn(D, W, generator=gen).cuda().requires_grad_()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = jt.causal_conv1d_fn(x, w, activation="silu")
        y.sum().backward()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    yr = jt.causal_conv1d_ref(xr, wr, activation="silu")
    yr.sum().backward()
    close(y, yr, torch.float32)
    close(x.grad, xr.grad, torch.float32)
    close(w.grad, wr.grad, torch.float32, scale=max(1.0, wr.grad.abs().max().item()))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and _jcc_cuda with DLPack entry points")
def test_cuda_bad_inputs():
    x = torch.randn(2, 8, 10, device="cuda")
    w = torch.randn(8, 4, device="cuda")
    with pytest.raises(TypeError, match="float64 is CPU-only"):
        jt.causal_conv1d_fn(x.double(), w.double())
    with pytest.raises(ValueError, match="weight is on cpu but x is on cuda"):
        jt.causal_conv1d_fn(x, w.cpu())
    with pytest.raises(ValueError, match="expected 'cuda'"):
        kernels.CUDA.mod.fwd(x.cpu(), w[None].cpu(), None, None, None, None, None, x.cpu(), None, 0, 0,
                         False, False, stream=0)

