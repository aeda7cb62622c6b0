"""The static configuration of one call, and the kernels' array convention.

Kernel convention (csrc/problem.h): x is 3-D, (B, D, L) or (B, L, D); weight
is (G, D, W) and bias (G, D), row b using group b // (B // G) (a vmapped
weight becomes G > 1); varlen x is (B, T, D) with cu_seqlens (B, N+1) and
states (B*N, D, W-1). Absent optional arrays are None in Python and
zero-size placeholders at the FFI boundary.
"""

from __future__ import annotations

import dataclasses

ROWS, SEQ_IDX, VARLEN = 0, 1, 2  # csrc/problem.h SegmentMode


@dataclasses.dataclass(frozen=True)
class ConvConfig:
    activation: str | None
    mode: int
    channels_last: bool
    states_channels_last: bool
    want_final: bool
    backend: str  # "auto" or "ffi"
    # The forward of a call being differentiated (custom_vjp's fwd rule):
    # backend="auto" may route a forward differently then (routing.py).
    differentiated: bool = False


@dataclasses.dataclass(frozen=True)
class UpdateConfig:
    activation: str | None
    backend: str
    channels_last: bool = False  # x (B, S, D), state (N, state_len, D)


def state_shape(cfg, x, w, cu):
    """Shape of the initial/final states of a call in the kernel convention."""
    B, D = x.shape[0], (x.shape[2] if cfg.channels_last else x.shape[1])
    rows = B * (cu.shape[1] - 1) if cfg.mode == VARLEN else B
    H = w.shape[-1] - 1
    return (rows, H, D) if cfg.states_channels_last else (rows, D, H)


def split_groups(a, G):
    """(G * n, ...) -> (G, n, ...): the rows of each weight group."""
    return None if a is None else a.reshape((G, a.shape[0] // G) + a.shape[1:])


# (explicit sizes, not -1: arrays may have zero-size axes, e.g. W-1 = 0)
def fold(a):
    """(n, m, ...) -> (n * m, ...)"""
    return None if a is None else a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])


def unfold(a, n):
    """(n * m, ...) -> (n, m, ...)"""
    return None if a is None else a.reshape((n, a.shape[0] // n) + a.shape[1:])
