"""Where ``backend="auto"`` takes XLA's shifted sum on a GPU although our
CUDA kernel exists: the cells in which the kernel measured slower than XLA
at the large shapes (docs/benchmarks.md's GPU matrix; docs/performance-log.md
says which cells and why). ``backend="ffi"`` still insists on the kernel.
Every other platform and cell takes the kernel."""

from __future__ import annotations


def gpu_kernel_wins(cfg, width: int) -> bool:
    """False where the XLA twin is faster on a GPU for this configuration."""
    if width == 1:
        return False  # a per-channel scale: XLA fuses the forward into the backward
    if cfg.channels_last:
        return True  # the channels-last kernels beat XLA at every measured width
    if 17 <= width <= 32:
        return False  # the tile family's middle widths (issue 17)
    return True
