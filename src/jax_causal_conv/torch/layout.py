"""Dao's layouts for (batch, channels, length) tensors, and the arrays the
kernels see.

A (b, c, n) tensor is channel-last when ``stride(1) == 1 and stride(2) > 1``
(a transposed view of a (b, n, c) tensor; Dao's test), else channel-first.
The kernels take channel-first arrays as (b, c, n) and channel-last ones as
(b, n, c), dense in that shape (x may be strided where the module allows it).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def is_channel_last(t: Tensor) -> bool:
    return t.stride(1) == 1 and t.stride(2) > 1


def empty(b: int, c: int, n: int, channel_last: bool, dtype, device) -> Tensor:
    """A fresh (b, c, n) tensor stored as (b, n, c) if channel_last: never a
    view (a custom op's outputs must not be views, or in-place updates of
    them fail under autograd), and its strides depend only on the
    arguments, so an op's fake and real implementations agree."""
    strides = (n * c, 1, c) if channel_last else (c * n, n, 1)
    return torch.empty_strided((b, c, n), strides, dtype=dtype, device=device)


def is_dense(t: Tensor, channel_last: bool) -> bool:
    """Stored densely as (b, n, c) if channel_last, else as (b, c, n);
    strides of size-1 axes do not matter."""
    if not channel_last:
        return t.is_contiguous()
    b, c, n = t.shape
    s0, s1, s2 = t.stride()
    return (c == 1 or s1 == 1) and (n == 1 or s2 == c) and (b == 1 or s0 == n * c)


def inner_unit_stride(t: Tensor, channel_last: bool) -> bool:
    """The innermost axis in the layout (channels if channel_last, else time)
    is unit-stride (or has one element): what a strided x needs."""
    axis = 1 if channel_last else 2
    return t.shape[axis] == 1 or t.stride(axis) == 1


def for_kernel(t: Tensor, channel_last: bool, strided_ok: bool = False) -> Tensor:
    """t itself when the kernels can read it in that layout (dense, or with
    strided_ok any strides with a unit-stride innermost axis), else a dense
    copy in that layout."""
    if (strided_ok and inner_unit_stride(t, channel_last)) or is_dense(t, channel_last):
        return t
    if channel_last:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t.contiguous()


def tokens_for_kernel(x: Tensor, strided_ok: bool = False) -> Tensor:
    """A (tokens, c) tensor as the kernels read it: itself if dense (or, with
    strided_ok, if its channels are unit-stride), else a dense copy."""
    if strided_ok and (x.shape[1] == 1 or x.stride(1) == 1):
        return x
    return x.contiguous()


def kernel_view(t: Optional[Tensor], channel_last: bool) -> Optional[Tensor]:
    """The array the kernels see: (b, n, c) if channel_last, else (b, c, n)."""
    if t is None or not channel_last:
        return t
    return t.transpose(1, 2)
