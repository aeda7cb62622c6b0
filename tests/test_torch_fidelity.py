"""jax_causal_conv.torch as a drop-in for code written for Dao-AILab
causal-conv1d 1.7: the SPEC's seq_idx semantics (padding, initial states of
a row's first segment, final states of its last one) against an
independent numpy oracle, outputs that can be modified in place under
autograd, strided inputs (Mamba's xz.chunk halves, Dao's x[..., :dim]
slices) handed to the kernels without a copy, channel-last decode states,
and the argument spellings Dao accepts. CUDA cases carry the gpu mark."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import jax_causal_conv.torch as jt  # noqa: E402
from jax_causal_conv.torch.layout import is_channel_last  # noqa: E402
import oracle  # noqa: E402
from torch_support import (CHANNELS_LAST_DECODE, DEVICES, HAS_CUDA, SEQ_IDX_TABLE,  # noqa: E402
                           SPEC_SEQ_IDX, STRIDED_X, EntrySpy, channels_last_decode, close,
                           kernels, make_x, skip_f64_on_gpu)

TABLE = sorted(SEQ_IDX_TABLE)


def _table_inputs(case, W, with_init, dtype=torch.float64, device="cpu", channel_last=False):
    gen = torch.Generator().manual_seed(W * 31 + len(case))
    s = torch.tensor([SEQ_IDX_TABLE[case]], dtype=torch.int32, device=device)
    D, L = 6, s.shape[1]
    x = make_x(1, D, L, dtype, device, channel_last, gen)
    w = (torch.randn(D, W, generator=gen, dtype=torch.float64) / W**0.5).to(device, dtype)
    b = torch.randn(D, generator=gen, dtype=torch.float64).to(device, dtype)
    h = make_x(1, D, W - 1, dtype, device, channel_last, gen) if with_init else None
    return x, w, b, s, h


def _np(t):
    return None if t is None else t.detach().double().cpu().numpy()


# --- seq_idx: the SPEC's semantics ------------------------------------------------------------


@pytest.mark.parametrize("case", TABLE)
@pytest.mark.parametrize("W", [1, 2, 4, 5])
@pytest.mark.parametrize("with_init", [False, True], ids=["zeros", "init"])
def test_reference_follows_the_spec(case, W, with_init):
    x, w, b, s, h = _table_inputs(case, W, with_init)
    y, fs = jt.causal_conv1d_ref(x, w, b, initial_states=h, return_final_states=True,
                                 activation="silu", seq_idx=s)
    yo, fo = oracle.conv(_np(x), _np(w), _np(b), "silu", seq_idx=s.numpy(), init=_np(h))
    np.testing.assert_allclose(y.numpy(), yo, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(fs.numpy(), fo)
    assert (y[0, :, s[0] < 0] == 0).all()  # padding outputs are exactly 0


@SPEC_SEQ_IDX
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", TABLE)
@pytest.mark.parametrize("W", [1, 2, 4, 5])
@pytest.mark.parametrize("with_init", [False, True], ids=["zeros", "init"])
@pytest.mark.parametrize("channel_last", [False, True], ids=["cf", "cl"])
def test_kernels_follow_the_spec_forward_and_gradients(device, case, W, with_init, channel_last):
    dtype = torch.float32 if device == "cuda" else torch.float64
    x, w, b, s, h = _table_inputs(case, W, with_init, dtype, device, channel_last)
    gy = torch.randn(x.shape, dtype=torch.float64, device=device)
    gf = torch.randn(1, x.shape[1], W - 1, dtype=torch.float64, device=device)

    def run(fn):
        ins = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b, h)]
        y, fs = fn(ins[0], ins[1], ins[2], initial_states=ins[3], return_final_states=True,
                   activation="silu", seq_idx=s)
        ((y.double() * gy).sum() + (fs.double() * gf).sum()).backward()
        return y, fs, [t.grad for t in ins if t is not None]

    y, fs, grads = run(jt.causal_conv1d_fn)
    yr, fr, grads_r = run(jt.causal_conv1d_ref)
    yo, fo = oracle.conv(_np(x), _np(w), _np(b), "silu", seq_idx=s.cpu().numpy(), init=_np(h))
    close(y, torch.from_numpy(yo), dtype)
    close(fs, torch.from_numpy(fo), dtype)
    assert (y[0, :, s[0] < 0] == 0).all()
    for g, r in zip(grads, grads_r):
        close(g, r, dtype, scale=max(1.0, r.abs().max().item()) if r.numel() else 1.0)


@SPEC_SEQ_IDX
@pytest.mark.parametrize("case", ["padding-middle-and-tail", "short-first-segment",
                                  "one-token-segments", "short-last-then-padding"])
def test_seq_idx_gradcheck_float64(case):
    x, w, b, s, h = _table_inputs(case, 4, True)
    ins = tuple(t.requires_grad_() for t in (x, w, b, h))

    def f(x, w, b, h):
        return jt.causal_conv1d_fn(x, w, b, seq_idx=s, initial_states=h, return_final_states=True,
                                   activation="silu")

    assert torch.autograd.gradcheck(f, ins)


@SPEC_SEQ_IDX
@pytest.mark.parametrize("device", DEVICES)
def test_packed_rows_with_initial_states_equal_separate_sequences(device):
    """Dao 1.7's contract: the initial state is the first segment's history;
    later segments start from zeros. Here x is a channel-last slice of a
    wider tensor, as in Dao's test."""
    gen = torch.Generator().manual_seed(17)
    ids = [[3, 5, 5, 5, 9, 9, 9], [4, 4, 6, 6, 6, 6, 8]]
    s = torch.tensor(ids, dtype=torch.int32, device=device)
    B, L, D, W = 2, 7, 16, 4
    x = torch.randn(B, L, D + 8, generator=gen).to(device)[..., :D].transpose(1, 2)
    w, b = torch.randn(D, W, generator=gen).to(device), torch.randn(D, generator=gen).to(device)
    h = torch.randn(B, W - 1, D, generator=gen).to(device).transpose(1, 2)
    y = jt.causal_conv1d_fn(x, w, b, seq_idx=s, initial_states=h, activation="silu")
    for r in range(B):
        start = 0
        for t in range(1, L + 1):
            if t == L or ids[r][t] != ids[r][start]:
                init = h[r:r + 1] if start == 0 else None
                part = jt.causal_conv1d_ref(x[r:r + 1, :, start:t], w, b, initial_states=init,
                                            activation="silu")
                close(y[r:r + 1, :, start:t], part, torch.float32)
                start = t


@SPEC_SEQ_IDX
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channel_last", [False, True], ids=["cf", "cl"])
def test_chunked_prefill_of_packed_rows_equals_one_shot(device, channel_last):
    """Final states of one chunk are the next chunk's initial states: the row's
    last segment continues into the next chunk's first."""
    gen = torch.Generator().manual_seed(5)
    B, D, L, W, cut = 2, 8, 14, 4, 6
    s = torch.tensor([[0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, -1, -1, -1],
                      [5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6]], dtype=torch.int32, device=device)
    x = make_x(B, D, L, torch.float32, device, channel_last, gen)
    w, b = torch.randn(D, W, generator=gen).to(device), torch.randn(D, generator=gen).to(device)
    h = make_x(B, D, W - 1, torch.float32, device, channel_last, gen)
    y, fs = jt.causal_conv1d_fn(x, w, b, seq_idx=s, initial_states=h, return_final_states=True)
    y1, f1 = jt.causal_conv1d_fn(x[..., :cut], w, b, seq_idx=s[:, :cut].contiguous(),
                                 initial_states=h, return_final_states=True)
    y2, f2 = jt.causal_conv1d_fn(x[..., cut:], w, b, seq_idx=s[:, cut:].contiguous(),
                                 initial_states=f1, return_final_states=True)
    close(torch.cat([y1, y2], dim=-1), y, torch.float32)
    close(f2, fs, torch.float32)


# --- outputs are ordinary tensors ---------------------------------------------------------------


MODES = ["plain", "states", "seq_idx", "channel_last", "final_states_out",
         pytest.param("seq_idx_states", marks=SPEC_SEQ_IDX)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("grad", [False, True], ids=["nograd", "grad"])
def test_every_returned_tensor_can_be_modified_in_place(device, mode, grad):
    """As Dao's tests and model code do (`out += ...` after return_final_states):
    no 'view ... modified inplace' error, and gradients still right."""
    gen = torch.Generator().manual_seed(3)
    B, D, L, W = 2, 8, 12, 4
    x = make_x(B, D, L, torch.float32, device, mode == "channel_last", gen)
    w, b = torch.randn(D, W, generator=gen).to(device), torch.randn(D, generator=gen).to(device)
    kw = dict(return_final_states=True, activation="silu")
    h = make_x(B, D, W - 1, torch.float32, device, True, gen) if "states" in mode else None
    if "seq_idx" in mode:  # the last segments are longer than W-1
        kw["seq_idx"] = torch.tensor([[0] * 3 + [1] * 9, [2] * 12], dtype=torch.int32, device=device)

    def run(fn):
        ins = [t.detach().clone().requires_grad_(grad) if t is not None else None for t in (x, w, b, h)]
        extra = {}
        if mode == "final_states_out":
            extra["final_states_out"] = torch.zeros(B, W - 1, D, device=device).transpose(1, 2)
        y, fs = fn(ins[0], ins[1], ins[2], initial_states=ins[3], **kw, **extra)
        y += F.sigmoid(fs).sum(dim=-1, keepdim=True)  # Dao's test does this
        fs *= 3
        y.mul_(2)
        if grad:
            (y.square().sum() + fs.sum()).backward()
        return y, fs, [t.grad for t in ins if t is not None]

    y, fs, g = run(jt.causal_conv1d_fn)
    yr, fr, gr = run(jt.causal_conv1d_ref)
    close(y, yr, torch.float32, scale=4)
    close(fs, fr, torch.float32)
    for a, r in zip(g, gr):
        if grad:
            close(a, r, torch.float32, scale=max(1.0, r.abs().max().item()))
        else:
            assert a is None and r is None


@pytest.mark.parametrize("device", DEVICES)
def test_final_states_out_is_written_by_the_kernel(device):
    gen = torch.Generator().manual_seed(4)
    x = make_x(2, 8, 9, torch.float32, device, True, gen)
    w = torch.randn(8, 4, generator=gen).to(device)
    for out_cl in (False, True):
        out = make_x(2, 8, 3, torch.float32, device, out_cl, gen)
        spy = EntrySpy(kernels.for_device(x.device).mod)
        k = kernels.for_device(x.device)
        real, k.mod = k.mod, spy
        try:
            y, fs = jt.causal_conv1d_fn(x, w, return_final_states=True, final_states_out=out)
        finally:
            k.mod = real
        assert fs is out
        assert spy.received("fwd", 8).data_ptr() == out.data_ptr()  # no copy afterwards
        close(out, jt.causal_conv1d_ref(x, w, return_final_states=True)[1], torch.float32)


# --- strided inputs -------------------------------------------------------------------------------


def _strided_cases(device, gen, B=2, D=16, L=20):
    """(name, base, view): Mamba's xz.chunk(2, dim=1) halves (channel-first,
    batch stride 2*D*L), Dao 1.7's x[..., :dim] of a channel-last tensor, a
    channel-first slice with padded channels, and a batch-1 channel-last one;
    view(base) is x."""
    xz = torch.randn(B, 2 * D, L, generator=gen).to(device)
    wide_cl = torch.randn(B, L, D + 24, generator=gen).to(device)
    padded = torch.randn(B, D + 5, L, generator=gen).to(device)
    return [("xz-chunk", xz, lambda t: t.chunk(2, dim=1)[0]),
            ("xz-chunk-second", xz, lambda t: t.chunk(2, dim=1)[1]),
            ("cl-slice", wide_cl, lambda t: t[..., 8:8 + D].transpose(1, 2)),
            ("cf-slice", padded, lambda t: t[:, 2:2 + D]),
            ("cl-slice-b1", wide_cl[:1].clone(), lambda t: t[..., :D].transpose(1, 2))]


@pytest.mark.parametrize("device", DEVICES)
def test_strided_x_values_and_gradients(device):
    gen = torch.Generator().manual_seed(8)
    w, b = torch.randn(16, 4, generator=gen).to(device), torch.randn(16, generator=gen).to(device)
    for name, base, view in _strided_cases(device, gen):
        x = view(base)
        assert not x.is_contiguous() and not x.transpose(1, 2).is_contiguous(), name
        y = jt.causal_conv1d_fn(x, w, b, activation="silu")
        close(y, jt.causal_conv1d_ref(x, w, b, activation="silu"), torch.float32)
        assert is_channel_last(y) == is_channel_last(x), name
        # gradients reach the wider leaf through the view
        la, lr = base.clone().requires_grad_(), base.clone().requires_grad_()
        g = torch.randn(y.shape, generator=gen).to(device)
        jt.causal_conv1d_fn(view(la), w, b, activation="silu").backward(g)
        jt.causal_conv1d_ref(view(lr), w, b, activation="silu").backward(g)
        close(la.grad, lr.grad, torch.float32)


def _spied_call(device, f, strided):
    """f() with the module's entry points observed; the module says it
    takes strided x (`strided`), the spy giving the real module dense
    copies when it does not yet."""
    k = kernels.for_device(torch.device(device))
    spy = EntrySpy(k.mod, densify=strided and not k.strided_x)
    real_mod, real_flag = k.mod, k.strided_x
    k.mod, k.strided_x = spy, strided
    try:
        out = f()
    finally:
        k.mod, k.strided_x = real_mod, real_flag
    return out, spy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad", [False, True], ids=["direct", "autograd"])
def test_strided_x_reaches_the_kernels_without_a_copy(device, grad):
    """When the module accepts strided x, the adapter hands over the user's
    view itself (same memory, same strides), forward and backward; when it
    does not, a dense copy."""
    gen = torch.Generator().manual_seed(9)
    w = torch.randn(16, 4, generator=gen).to(device)
    for name, base, view in _strided_cases(device, gen):
        x = view(base.requires_grad_(grad))
        cl = is_channel_last(x)
        seen = x.transpose(1, 2) if cl else x  # what the kernels see
        out, spy = _spied_call(device, lambda: jt.causal_conv1d_fn(x, w, activation="silu"), True)
        got = spy.received("fwd", 0)
        assert got.data_ptr() == x.data_ptr() and got.stride() == seen.stride(), name
        close(out, jt.causal_conv1d_ref(x, w, activation="silu"), torch.float32)
        if grad:
            _, spy = _spied_call(device, lambda: out.sum().backward(), True)
            got = spy.received("bwd", 0)
            assert got.data_ptr() == x.data_ptr() and got.stride() == seen.stride(), name
        _, spy = _spied_call(device, lambda: jt.causal_conv1d_fn(view(base.detach()), w), False)
        assert spy.received("fwd", 0).data_ptr() != x.data_ptr(), name  # the fallback copies


@STRIDED_X
@pytest.mark.parametrize("device", DEVICES)
def test_kernels_read_strided_x(device):
    gen = torch.Generator().manual_seed(10)
    w = torch.randn(16, 4, generator=gen).to(device)
    for name, base, view in _strided_cases(device, gen):
        x = view(base)
        out, spy = _spied_call(device, lambda: jt.causal_conv1d_fn(x, w, activation="silu"), True)
        assert spy.received("fwd", 0).data_ptr() == x.data_ptr(), name
        close(out, jt.causal_conv1d_ref(x, w, activation="silu"), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_batch1_channel_last_forward_copies_nothing(device):
    """(1, L, D) activations transposed, Dao's channel-last: x, y and the
    final states are the kernels' own arrays."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1, 64, 32, generator=gen).to(device, torch.bfloat16).transpose(1, 2)
    w = torch.randn(32, 4, generator=gen).to(device, torch.bfloat16)
    (y, fs), spy = _spied_call(device, lambda: jt.causal_conv1d_fn(x, w, return_final_states=True),
                               kernels.for_device(x.device).strided_x)
    assert spy.received("fwd", 0).data_ptr() == x.data_ptr()
    assert spy.received("fwd", 7).data_ptr() == y.data_ptr()
    assert spy.received("fwd", 8).data_ptr() == fs.data_ptr()
    assert is_channel_last(y) and y._base is None and fs._base is None


@pytest.mark.parametrize("device", DEVICES)
def test_update_and_varlen_states_with_strided_x(device):
    """Mamba2's decode step hands a slice of its projection to the update;
    vLLM's prefill a slice of its token matrix to varlen_states."""
    gen = torch.Generator().manual_seed(12)
    B, D, W = 3, 16, 4
    w = torch.randn(D, W, generator=gen).to(device)
    proj = torch.randn(B, 3 * D, generator=gen).to(device)
    x = proj[:, D:2 * D]  # (B, D), row stride 3D
    state, state_ref = (torch.randn(B, D, W - 1, generator=gen).to(device) for _ in range(2))
    state_ref.copy_(state)
    y = jt.causal_conv1d_update(x, state, w, activation="silu")
    close(y, jt.causal_conv1d_update_ref(x, state_ref, w, activation="silu"), torch.float32)
    close(state, state_ref, torch.float32)
    tokens = torch.randn(20, 2 * D, generator=gen).to(device)[:, :D]
    cu = torch.tensor([0, 7, 20], dtype=torch.int32, device=device)
    close(jt.causal_conv1d_varlen_states(tokens, cu, 5),
          jt.causal_conv1d_varlen_states_ref(tokens, cu, 5), torch.float32)


# --- decode states in Dao's channel-last layout --------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("variant", ["rolling", "circular", "indices"])
def test_channel_last_conv_state(channels_last_decode, dtype, variant):
    """Dao's update test layout: x and conv_state transposed (B, S, D) and
    (B, state_len, D) tensors; the state is updated in place, where it
    lives when the kernels take channel-last states."""
    dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(13)
    B, D, S, W, SL = 3, 16, 2, 4, 6
    x = torch.randn(B, S, D, generator=gen).to(dtype).transpose(1, 2)
    slots, kw = B, {}
    if variant == "circular":
        kw["cache_seqlens"] = torch.tensor([0, 5, 13], dtype=torch.int32)
    elif variant == "indices":
        slots = 5
        kw["conv_state_indices"] = torch.tensor([4, -1, 0], dtype=torch.int32)
    state = torch.randn(slots, SL, D, generator=gen).to(dtype).transpose(1, 2)
    state_ref = state.clone()
    w = torch.randn(D, W, generator=gen)
    y = jt.causal_conv1d_update(x, state, w, activation="silu", **kw)
    yr = jt.causal_conv1d_update_ref(x, state_ref, w, activation="silu", **kw)
    close(y, yr, dtype)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=0)
    for one_token in (x[..., 0], x[..., :1]):  # (B, D) and (B, D, 1)
        y = jt.causal_conv1d_update(one_token, state, w, **kw)
        close(y, jt.causal_conv1d_update_ref(one_token, state_ref, w, **kw), dtype)
        assert y.shape == one_token.shape
    torch.testing.assert_close(state, state_ref, rtol=0, atol=0)
    if channels_last_decode.channels_last_decode and hasattr(channels_last_decode.mod, "received"):
        assert channels_last_decode.mod.received("update", 1).data_ptr() == state.data_ptr()


@CHANNELS_LAST_DECODE
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device and _jcc_cuda with DLPack entry points")
def test_channel_last_conv_state_cuda():
    gen = torch.Generator().manual_seed(14)
    state = torch.randn(4, 5, 16, generator=gen).cuda().transpose(1, 2)
    state_ref = state.clone()
    x = torch.randn(4, 16, generator=gen).cuda()
    w = torch.randn(16, 4, generator=gen).cuda()
    y = jt.causal_conv1d_update(x, state, w, activation="silu")
    close(y, jt.causal_conv1d_update_ref(x, state_ref, w, activation="silu"), torch.float32)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=0)


def test_varlen_states_feed_a_channel_last_decode(channels_last_decode):
    """Prefill -> decode hand-off: varlen_states returns Dao's channel-last
    layout when the kernels have it (a fresh tensor, not a view), and the
    decode updates it in place."""
    gen = torch.Generator().manual_seed(15)
    D, W = 16, 4
    cu = torch.tensor([0, 6, 6, 13], dtype=torch.int32)
    tokens = torch.randn(13, D, generator=gen)
    w = torch.randn(D, W, generator=gen)
    states = jt.causal_conv1d_varlen_states(tokens, cu, W - 1)
    assert is_channel_last(states) == channels_last_decode.channels_last_decode
    assert states._base is None
    close(states, jt.causal_conv1d_varlen_states_ref(tokens, cu, W - 1), torch.float32)
    step = torch.randn(3, D, generator=gen)
    ref_state = states.clone()
    y = jt.causal_conv1d_update(step, states, w)
    close(y, jt.causal_conv1d_update_ref(step, ref_state, w), torch.float32)
    torch.testing.assert_close(states, ref_state, rtol=0, atol=0)


# --- argument spellings --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_activation_spellings(device, dtype):
    dtype = getattr(torch, dtype)
    skip_f64_on_gpu(device, dtype)
    gen = torch.Generator().manual_seed(16)
    x = make_x(2, 8, 10, dtype, device, False, gen)
    w = torch.randn(8, 4, generator=gen).to(device, dtype)
    silu = [jt.causal_conv1d_fn(x, w, activation=a) for a in ("silu", "swish", True)]
    plain = [jt.causal_conv1d_fn(x, w, activation=a) for a in (None, False)]
    assert all(torch.equal(silu[0], t) for t in silu) and torch.equal(plain[0], plain[1])
    close(silu[0], F.silu(plain[0]), dtype)
    state = torch.zeros(2, 8, 3, device=device, dtype=dtype)
    ys = [jt.causal_conv1d_update(x[..., 0], state.clone(), w, activation=a) for a in ("swish", True)]
    assert torch.equal(ys[0], ys[1])
