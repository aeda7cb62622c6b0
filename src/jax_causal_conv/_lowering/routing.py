"""Where ``backend="auto"`` takes XLA's shifted sum although our kernel
exists: the cells in which the kernel measured slower than XLA at the large
shapes (docs/benchmarks.md's GPU and CPU matrices; docs/performance-log.md
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


def cpu_forward_wins(cfg, width: int, has_initial_states: bool) -> bool:
    """False where the XLA twin's forward is faster on the CPU: a forward
    that nothing differentiates at W <= 2 without states (dense or seq_idx,
    either layout), where XLA's one fused elementwise pass is level with the
    kernel or ahead of it. In a training step the kernel's forward stays:
    XLA's forward beside our backward measured slower there than ours
    (docs/performance-log.md, 2026-11-26). The backward keeps the kernel
    (faster there at every measured width)."""
    plain = cfg.mode != VARLEN and not has_initial_states and not cfg.want_final
    return cfg.differentiated or not (width <= 2 and plain)
