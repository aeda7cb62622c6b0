"""Helpers of the torch adapter tests: devices, tolerances, inputs, an
independent numpy oracle of the SPEC's seq_idx semantics, a table of
seq_idx edge cases, probes for what the compiled kernels support, and a spy
that shows what reaches a kernel entry point."""

import pytest
import torch
from torch.utils.dlpack import from_dlpack, to_dlpack

import jax_causal_conv.torch as jt
from jax_causal_conv.torch import kernels

HAS_CUDA = torch.cuda.is_available() and kernels.CUDA is not None
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)] if HAS_CUDA else ["cpu"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64}
# (rtol, atol) for results rounded once from a float32 accumulator.
TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 2e-5),
       torch.float16: (4e-3, 4e-3), torch.bfloat16: (2e-2, 2e-2)}


def close(a, b, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(a.double().cpu(), b.double().cpu(), rtol=rtol, atol=atol * scale)


def skip_f64_on_gpu(device, dtype):
    if device == "cuda" and dtype == torch.float64:
        pytest.skip("float64 is CPU-only")


def make_x(B, D, L, dtype, device, channel_last, gen):
    if channel_last:  # Dao's channel-last: a transposed (B, L, D) tensor
        return torch.randn(B, L, D, generator=gen, dtype=torch.float32).to(device, dtype).transpose(1, 2)
    return torch.randn(B, D, L, generator=gen, dtype=torch.float32).to(device, dtype)


def make_seq_idx(B, L, device, gen):
    return torch.sort(torch.randint(0, 4, (B, L), generator=gen), dim=1).values.to(device, torch.int32)


# --- the SPEC's seq_idx semantics (the float64 oracle is tests/oracle.py) -----------------

# Rows of length 9 with the edge cases the SPEC's rules meet (W up to 5).
SEQ_IDX_TABLE = {
    "padding-middle-and-tail": [0, 0, 0, -1, -1, 1, 1, -1, -1],
    "ids-not-increasing": [2, 2, 0, 0, 0, 1, 1, 1, 1],
    "id-revisited": [0, 0, 1, 1, 0, 0, 0, 1, 1],
    "short-first-segment": [0, 1, 1, 1, 1, 2, 2, 2, 2],
    "all-padding": [-1] * 9,
    "padding-first": [-1, -1, 0, 0, 0, 0, 0, 0, 0],
    "one-token-segments": [5, 1, 1, 1, 1, 7, 2, 2, 9],
    "all-distinct": [0, 1, 2, 3, 4, 5, 6, 7, 8],
    "short-last-then-padding": [0, 0, 0, 0, 1, 1, -1, -1, -1],
    "negative-ids-differ": [0, 0, -3, -1, 0, 0, -3, 0, 0],
    "one-segment": [4] * 9,
}


# --- what the compiled kernels support ----------------------------------------------------


def kernels_have_spec_seq_idx() -> bool:
    """Whether the kernels take seq_idx together with initial_states (the
    SPEC's semantics land with that): the tests then check the values, so a
    wrong kernel fails them instead of skipping them."""
    x, w = torch.ones(1, 1, 4), torch.ones(1, 3)
    s = torch.tensor([[0, -1, 0, 1]], dtype=torch.int32)
    try:
        jt.causal_conv1d_fn(x, w, seq_idx=s, initial_states=torch.ones(1, 1, 2),
                            return_final_states=True)
    except ValueError:
        return False
    return True


SPEC_SEQ_IDX = pytest.mark.skipif(
    not kernels_have_spec_seq_idx(),
    reason="needs the SPEC seq_idx semantics (padding, initial_states, final states) in the kernels")
STRIDED_X = pytest.mark.skipif(not kernels.CPU.strided_x,
                               reason="needs strided x in the kernels (_jcc_cpu.strided_x)")
CHANNELS_LAST_DECODE = pytest.mark.skipif(
    not kernels.CPU.channels_last_decode,
    reason="needs channels-last decode in the kernels (update/varlen_states channels_last)")


# --- observing the entry points ------------------------------------------------------------


class EntrySpy:
    """Stands in for a compiled module: records, per call of an entry point,
    the tensors it receives (torch views of the capsules: same memory, same
    strides), then calls the real entry point with them, as `adapt` leaves
    them. With `densify`, arrays the real module cannot read yet (strided)
    are handed to it as dense copies, so the Python side can be tested
    before the kernels support them."""

    def __init__(self, mod, densify=False):
        self._mod = mod
        self._densify = densify
        self.calls = []

    def adapt(self, name, args):
        return [a.contiguous() if self._densify and isinstance(a, torch.Tensor) else a for a in args]

    def __getattr__(self, name):
        real = getattr(self._mod, name)
        if not callable(real):
            return real

        def entry(*args, **kwargs):
            seen = [from_dlpack(a) if type(a).__name__ == "PyCapsule" else a for a in args]
            self.calls.append((name, seen))
            fwd = [to_dlpack(a) if isinstance(a, torch.Tensor) else a for a in self.adapt(name, seen)]
            return real(*fwd, **kwargs)

        return entry

    def received(self, name, index):
        """The tensor argument `index` of the last call of entry point `name`."""
        return [c for c in self.calls if c[0] == name][-1][1][index]


class CompactArgsEmulator(EntrySpy):
    """A module that takes weight (D, W), bias (D,) and one-token update x
    and y (B, D) (``compact_args``), emulated on the real entry points by
    adding the unit axes they expect."""

    _GROUPED = {"fwd": (1, 2), "bwd": (1, 2, 9, 10), "bwd_workspace_bytes": (1, 2),
                "update": (2, 3)}  # weight-like and bias-like arguments

    def adapt(self, name, args):
        args = list(args)
        for i in self._GROUPED.get(name, ()):
            if args[i] is not None and args[i].dim() in (1, 2):
                args[i] = args[i].unsqueeze(0)
        if name == "update" and args[0].dim() == 2:
            args[0], args[6] = args[0].unsqueeze(-1), args[6].unsqueeze(-1)
        return args


class ChannelsLastDecodeEmulator(EntrySpy):
    """A module whose update/varlen_states take ``channels_last`` (as the
    kernels will), emulated on the real channel-first entry points through
    dense copies: tests the adapter's side of channel-last decode states
    before the kernels have it. Records calls like EntrySpy."""

    def update(self, x, conv_state, weight, bias, cache_seqlens, conv_state_indices, y, activation,
               channels_last=False, **kw):
        seen = [from_dlpack(a) if type(a).__name__ == "PyCapsule" else a
                for a in (x, conv_state, weight, bias, cache_seqlens, conv_state_indices, y)]
        self.calls.append(("update", seen))
        xt, st, w, b, cs, idx, yt = seen
        if channels_last:  # (B, S, D), (N, SL, D), (B, S, D) -> channel-first copies
            xt, st_cf, y_cf = (xt.transpose(1, 2).contiguous(), st.transpose(1, 2).contiguous(),
                               torch.empty_like(yt.transpose(1, 2), memory_format=torch.contiguous_format))
        else:
            st_cf, y_cf = st, yt
        caps = [None if a is None else to_dlpack(a) for a in (xt, st_cf, w, b, cs, idx, y_cf)]
        self._mod.update(*caps, activation, **kw)
        if channels_last:
            st.copy_(st_cf.transpose(1, 2))
            yt.copy_(y_cf.transpose(1, 2))

    def varlen_states(self, x, cu_seqlens, states, channels_last=False, **kw):
        seen = [from_dlpack(a) for a in (x, cu_seqlens, states)]
        self.calls.append(("varlen_states", seen))
        out = seen[2]
        tmp = out.transpose(1, 2).contiguous() if channels_last else out
        self._mod.varlen_states(to_dlpack(seen[0]), to_dlpack(seen[1]), to_dlpack(tmp), **kw)
        if channels_last:
            out.copy_(tmp.transpose(1, 2))


def _native_or_emulated(param, flag, emulator):
    """The compiled CPU module as it is ("native"), or one whose `flag`
    feature is on: the module spied on when it has the feature, else
    `emulator` around it. A generator for the fixtures below."""
    k = kernels.CPU
    if param == "native":
        yield k
        return
    real_mod, real_flag = k.mod, getattr(k, flag)
    k.mod = EntrySpy(real_mod) if real_flag else emulator(real_mod)
    setattr(k, flag, True)
    try:
        yield k
    finally:
        k.mod = real_mod
        setattr(k, flag, real_flag)


@pytest.fixture(params=["native", "emulated"])
def compact_args(request):
    """The compiled CPU module as it is, and one that takes compact
    arguments (emulated when it does not)."""
    yield from _native_or_emulated(request.param, "compact_args", CompactArgsEmulator)


@pytest.fixture(params=["native", "emulated"])
def channels_last_decode(request):
    """The module the channel-last decode tests run on: the compiled one as
    it is, and one that takes channels_last (emulated when it does not)."""
    yield from _native_or_emulated(request.param, "channels_last_decode", ChannelsLastDecodeEmulator)
