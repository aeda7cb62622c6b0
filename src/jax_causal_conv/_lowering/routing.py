"""Where ``backend="auto"`` takes XLA's shifted sum on a GPU although our
CUDA kernel exists: the cells in which the kernel measured slower than XLA
at the large shapes (docs/benchmarks.md's GPU matrix; docs/performance-log.md
says which cells and why). ``backend="ffi"`` still insists on the kernel.
Every other platform and cell takes the kernel."""

from __future__ import annotations

from .config import VARLEN


def gpu_kernel_wins(cfg, width: int, length: int, itemsize: int) -> bool:
    """False where the XLA twin is faster on a GPU for this configuration
    (x's rows of `length` steps of `itemsize`-byte elements)."""
    if width == 1:
        return False  # a per-channel scale: XLA fuses the forward into the backward
    if cfg.channels_last:
        return True  # the channels-last kernels beat XLA at every measured width
    if width > 16 and (cfg.mode == VARLEN or length % (16 // itemsize) != 0):
        return False  # not the wide family's rows (whole 16-byte vectors, rows or seq_idx): the tile family
    return True
