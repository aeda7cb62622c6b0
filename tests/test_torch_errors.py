"""Bad input through the torch adapter: every misuse raises ValueError or
TypeError naming the argument, in the words of validation.py shared with the
JAX API; the C++ entry points check again when called directly."""

import pytest

torch = pytest.importorskip("torch")

import jax_causal_conv.torch as jt  # noqa: E402
from torch_support import close, kernels  # noqa: E402


BAD_CALLS = [  # (id, call, exception, regex); messages share validation.py's wording with JAX
    ("activation", lambda x, w: jt.causal_conv1d_fn(x, w, activation="relu"), ValueError,
     "activation must be None, 'silu' or 'swish', got 'relu'"),
    ("activation-dao", lambda x, w: jt.causal_conv1d_fn(x, w, activation="gelu"),
     NotImplementedError, "activation"),  # Dao raises NotImplementedError
    ("x-int", lambda x, w: jt.causal_conv1d_fn(x.int(), w), TypeError,
     "^x must be float32, float16, bfloat16 or float64, got int32$"),
    ("x-complex", lambda x, w: jt.causal_conv1d_fn(x.to(torch.complex64), w), TypeError,
     "got complex64"),
    ("x-rank", lambda x, w: jt.causal_conv1d_fn(x[0], w), ValueError,
     r"^x must have rank 3 \(batch, dim, seqlen\), got shape \(8, 10\)$"),
    ("weight-dim", lambda x, w: jt.causal_conv1d_fn(x, torch.randn(7, 4)), ValueError,
     r"^weight must have shape \(8, width\) to match x's 8 channels, got \(7, 4\)$"),
    ("layout-hint", lambda x, w: jt.causal_conv1d_fn(x.transpose(1, 2).contiguous(), w),
     ValueError, r"x \(2, 10, 8\) has 8 channels in the other layout.*x.transpose\(1, 2\)"),
    ("weight-width", lambda x, w: jt.causal_conv1d_fn(x, torch.randn(8, 0)), ValueError,
     r"weight width must be in \[1, \d+\], got width 0"),
    ("bias-shape", lambda x, w: jt.causal_conv1d_fn(x, w, torch.randn(9)), ValueError,
     r"^bias must have shape \(8,\) \(dim,\), got \(9,\)$"),
    ("seq_idx-dtype", lambda x, w: jt.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 10, dtype=torch.int64)),
     TypeError, "^seq_idx must be int32, got int64$"),
    ("seq_idx-shape", lambda x, w: jt.causal_conv1d_fn(x, w, seq_idx=torch.zeros(2, 9, dtype=torch.int32)),
     ValueError, r"seq_idx must have shape \(2, 10\)"),
    ("states-shape", lambda x, w: jt.causal_conv1d_fn(x, w, initial_states=torch.zeros(2, 8, 4)),
     ValueError, r"^initial_states must have shape \(2, 8, 3\) \(batch, dim, width - 1\), got \(2, 8, 4\)$"),
    ("states-dtype", lambda x, w: jt.causal_conv1d_fn(x, w, initial_states=torch.zeros(2, 8, 3, dtype=torch.float64)),
     TypeError, r"initial_states must have the dtype of x \(float32\), got float64"),
    ("final-out-shape", lambda x, w: jt.causal_conv1d_fn(x, w, return_final_states=True,
                                                         final_states_out=torch.zeros(2, 3, 8)),
     ValueError, r"final_states_out must have shape \(2, 8, 3\)"),
    ("device", lambda x, w: jt.causal_conv1d_fn(x, w.to("meta")), ValueError,
     "weight is on meta but x is on cpu"),
    ("not-a-tensor", lambda x, w: jt.causal_conv1d_fn(x, w.numpy()), TypeError,
     "weight must be a torch.Tensor, got ndarray"),
    ("x-not-a-tensor", lambda x, w: jt.causal_conv1d_fn(x.numpy(), w), TypeError,
     "x must be a torch.Tensor, got ndarray"),
    # update
    ("update-state-len", lambda x, w: jt.causal_conv1d_update(x[..., 0], torch.zeros(2, 8, 2), w),
     ValueError, r"conv_state's state_len must be >= width - 1 = 3, got state_len 2"),
    ("update-state-dim", lambda x, w: jt.causal_conv1d_update(x[..., 0], torch.zeros(2, 7, 3), w),
     ValueError, r"^conv_state must have shape \(num_slots, dim, state_len\) = \(num_slots, 8, state_len\) "
                 r"to match x's 8 channels, got \(2, 7, 3\)$"),
    ("update-slots", lambda x, w: jt.causal_conv1d_update(x[..., 0], torch.zeros(1, 8, 3), w),
     ValueError, "conv_state has 1 slots for batch 2: pass conv_state_indices"),
    ("update-seqlens-dtype", lambda x, w: jt.causal_conv1d_update(
        x[..., 0], torch.zeros(2, 8, 3), w, cache_seqlens=torch.zeros(2, dtype=torch.int64)),
     TypeError, "cache_seqlens must be int32, got int64"),
    ("update-indices-range", lambda x, w: jt.causal_conv1d_update(
        x[..., 0], torch.zeros(2, 8, 3), w, conv_state_indices=torch.tensor([0, 5], dtype=torch.int32)),
     ValueError, r"conv_state_indices\[1\] = 5 is outside \[-1, 2\)"),  # the CPU entry point's check
    ("update-state-dtype", lambda x, w: jt.causal_conv1d_update(x[..., 0], torch.zeros(2, 8, 3).double(), w),
     TypeError, r"conv_state must have the dtype of x \(float32\), got float64"),
    ("update-layout-hint", lambda x, w: jt.causal_conv1d_update(
        torch.randn(2, 5, 8), torch.zeros(2, 8, 3), w), ValueError, "x.transpose"),
    # varlen states: offsets are checked on the host by the CPU entry point
    ("vstates-start", lambda x, w: jt.causal_conv1d_varlen_states(
        torch.randn(6, 8), torch.tensor([1, 6], dtype=torch.int32), 3), ValueError,
     "cu_seqlens must start at 0, got 1"),
    ("vstates-end", lambda x, w: jt.causal_conv1d_varlen_states(
        torch.randn(6, 8), torch.tensor([0, 5], dtype=torch.int32), 3), ValueError,
     "cu_seqlens must end at the total length 6, got 5"),
    ("vstates-order", lambda x, w: jt.causal_conv1d_varlen_states(
        torch.randn(6, 8), torch.tensor([0, 4, 2, 6], dtype=torch.int32), 3), ValueError,
     "cu_seqlens must be non-decreasing"),
    ("vstates-float", lambda x, w: jt.causal_conv1d_varlen_states(
        torch.randn(6, 8), torch.tensor([0.0, 6.0]), 3), TypeError, "cu_seqlens must be int32, got float32"),
    ("vstates-len", lambda x, w: jt.causal_conv1d_varlen_states(
        torch.randn(6, 8), torch.tensor([0, 6], dtype=torch.int32), -1), ValueError, "state_len"),
]


@pytest.mark.parametrize("call,exc,pattern", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_inputs_raise(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(torch.randn(2, 8, 10), torch.randn(8, 4))


def test_messages_match_the_jax_api():
    """One wording across frameworks: the same misuse through JAX and torch."""
    import jax.numpy as jnp

    import jax_causal_conv as jcc

    def message(f):
        with pytest.raises((ValueError, TypeError)) as info:
            f()
        return str(info.value)

    x, w = torch.randn(2, 8, 10), torch.randn(8, 4)
    xj, wj = jnp.asarray(x.numpy()), jnp.asarray(w.numpy())
    pairs = [
        (lambda: jt.causal_conv1d_fn(x, w, torch.randn(9)),
         lambda: jcc.causal_conv1d(xj, wj, jnp.ones(9))),
        (lambda: jt.causal_conv1d_fn(x, torch.randn(7, 4)),
         lambda: jcc.causal_conv1d(xj, jnp.ones((7, 4)))),
        (lambda: jt.causal_conv1d_fn(x, w, initial_states=torch.zeros(2, 8, 4)),
         lambda: jcc.causal_conv1d(xj, wj, initial_states=jnp.zeros((2, 8, 4)))),
        (lambda: jt.causal_conv1d_update(x[..., 0], torch.zeros(2, 7, 3), w),
         lambda: jcc.causal_conv1d_update(xj[..., 0], jnp.zeros((2, 7, 3)), wj)),
        (lambda: jt.causal_conv1d_update(x[..., 0], torch.zeros(1, 8, 3), w),
         lambda: jcc.causal_conv1d_update(xj[..., 0], jnp.zeros((1, 8, 3)), wj)),
        (lambda: jt.causal_conv1d_fn(x.double().to(torch.complex128), w),
         lambda: jcc.causal_conv1d(xj.astype(jnp.complex64).astype(jnp.complex128), wj)),
    ]
    for t, j in pairs:
        assert message(t) == message(j)


def test_seq_idx_is_not_value_checked():
    """Decreasing ids and padding ids (< 0) are valid: an equality mask."""
    x, w = torch.randn(2, 8, 10), torch.randn(8, 4)
    s = torch.tensor([[3, 3, 1, 1, -1, 0, 0, 0, -1, -1]] * 2, dtype=torch.int32)
    y = jt.causal_conv1d_fn(x.transpose(1, 2).contiguous().transpose(1, 2), w, seq_idx=s)
    assert y.shape == x.shape


def test_dlpack_entry_points_validate():
    """The C++ entry points check what they are given, even when called directly."""
    m = kernels.CPU.mod
    x = torch.randn(2, 8, 10)
    w = torch.randn(1, 8, 4)
    y = torch.empty_like(x)
    args = [None, None, None, None, None]
    with pytest.raises(ValueError, match="x must have a unit-stride last axis"):
        m.fwd(x.transpose(1, 2), w, *args, y, None, 0, 0, False, False)
    with pytest.raises(TypeError, match="x must be float32, float16, bfloat16 or float64, got int32"):
        m.fwd(x.int(), w, *args, y, None, 0, 0, False, False)
    with pytest.raises(ValueError, match=r"weight has shape \(1, 7, 4\), expected \(1, 8, 4\)"):
        m.fwd(x, w[:, :7].contiguous(), *args, y, None, 0, 0, False, False)
    with pytest.raises(ValueError, match="weight must have rank 3"):
        m.fwd(x, w[0, 0], *args, y, None, 0, 0, False, False)
    with pytest.raises(ValueError, match="y has shape"):
        m.fwd(x, w, *args, y[:, :, :5].contiguous(), None, 0, 0, False, False)
    with pytest.raises(TypeError, match="y must have the dtype of x"):
        m.fwd(x, w, *args, y.double(), None, 0, 0, False, False)
    with pytest.raises(ValueError, match="activation must be 0"):
        m.fwd(x, w, *args, y, None, 7, 0, False, False)
    with pytest.raises(ValueError, match="seq_idx has shape"):
        m.fwd(x, w, None, None, torch.zeros(2, 9, dtype=torch.int32), None, None, y, None, 0, 1,
              False, False)
    with pytest.raises(ValueError, match="final_states has shape"):
        m.fwd(x, w, *args, y, torch.empty(2, 8, 4), 0, 0, False, False)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        m.fwd("x", w, *args, y, None, 0, 0, False, False)
    # bwd: outputs must be there
    with pytest.raises(ValueError, match="dbias is required"):
        m.bwd(x, w, torch.randn(1, 8), None, None, None, x, None, torch.empty_like(x),
              torch.empty_like(w), None, None, 0, 0, False, False)
    # a well-formed direct call works
    m.fwd(x, w, *args, y, None, 1, 0, False, False)
    close(y, jt.causal_conv1d_ref(x, w[0], activation="silu"), torch.float32)
