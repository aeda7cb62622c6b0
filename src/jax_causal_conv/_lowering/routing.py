"""Where ``backend="auto"`` takes XLA's shifted sum although our kernel
exists: the cells in which the kernel measured slower than XLA
(docs/benchmarks.md's GPU and CPU matrices; docs/performance-log.md says
which cells and why). ``backend="ffi"`` still insists on the kernel.
Every other platform and cell takes the kernel."""

from __future__ import annotations

import jax.numpy as jnp

from .config import ROWS, SEQ_IDX, VARLEN


# Below this many blocks of the channels-first shared-ids forward (batch x
# ceil(channels / 32) x chunks of 1024 steps, 512 in float32: under about
# one wave of an H100's 132 SMs) a forward that nothing differentiates at
# W <= 4 measured slower than XLA's (512 blocks: 1.09x and 1.27x its time;
# 4,096 blocks: XLA 1.67x ours; docs/benchmarks.md, 2026-11-26 seventh
# session). Between the two it was not measured.
SEQ_IDX_FWD_MIN_BLOCKS = 1024

# A channels-first dense forward (no states) that nothing differentiates at
# W <= 4 on at most this many elements (B * D * L): XLA's fused shifted sum
# measured level or ahead at both small shapes of the matrix ((1, 8192, 2048): 1.09x
# its device time, 1.16x its wall time; (32, 512, 1024): 0.98x on the
# device, 1.05x in wall time; docs/benchmarks.md, 2026-11-27 sixteenth
# session); at (8, 4096, 4096), eight times the elements, the kernel is
# 1.49x faster. W 2, 3 at these sizes and the sizes between not measured.
GPU_DENSE_FWD_MAX_ELEMENTS = 1 << 24

# The channels-first seq_idx forward alone at W = 2 in float32 measured
# behind XLA's on an H100 at (8, 4096, 4096) (370.8 µs device against 364.7;
# on an H200 level, 274.8 against 274.6; docs/benchmarks.md, 2026-11-26
# ninth session); other sizes were not measured: XLA there at every size.
# (W = 3 and 4 in float32: the kernel ahead, 371 / 374 µs against 382 / 390.)
# (The channels-last dense forward alone at W = 2 in float32 took XLA too
# until the thirty-fifth session, 2026-11-29: since the thirty-fourth's
# 8-byte words the kernel is ahead at both large shapes of the matrix,
# 266.6 / 267.0 µs against XLA's 279.1 / 274.4 on an H200.)


def _seq_idx_forward_blocks(batch: int, dim: int, length: int, itemsize: int) -> int:
    # (cuda/stream_ids.cuh's IdStreamBlocks: 32 channels a block, a chunk of
    # 32 lanes x 4 vectors of 16 bytes a span)
    chunk = 32 * 4 * (16 // itemsize)
    return batch * -(-dim // 32) * -(-length // chunk)


def gpu_kernel_wins(cfg, width: int, length: int, itemsize: int, batch: int = 0, dim: int = 0,
                    backward: bool = False, states: bool = False) -> bool:
    """False where the XLA twin is faster on a GPU for this configuration
    (x: `batch` rows of `dim` channels of `length` steps of `itemsize`-byte
    elements; 0: unknown; `states`: initial states given)."""
    if width == 1:
        return False  # a per-channel scale: XLA fuses the forward into the backward
    alone = not backward and not cfg.differentiated  # a forward nothing differentiates
    if cfg.channels_last:
        return True  # the channels-last kernels beat XLA at every measured width past 1
    if (cfg.mode == ROWS and not states and width <= 4 and alone and batch and dim
            and batch * dim * length <= GPU_DENSE_FWD_MAX_ELEMENTS):
        return False  # small enough for XLA's one fused pass
    if (cfg.mode == SEQ_IDX and width <= 4 and alone and batch and dim
            and _seq_idx_forward_blocks(batch, dim, length, itemsize) < SEQ_IDX_FWD_MIN_BLOCKS):
        return False  # too few blocks of the shared-ids forward to fill the GPU
    if cfg.mode == SEQ_IDX and width == 2 and itemsize == 4 and alone:
        return False  # float32 at W = 2: XLA's one fused pass measured ahead of the shared-ids forward
    if width > 16 and (cfg.mode == VARLEN or length % (16 // itemsize) != 0):
        return False  # not the wide family's rows (whole 16-byte vectors, rows or seq_idx): the tile family
    return True


# Small channels-first problems on the CPU (x of at most this many
# elements, B * D * L), where XLA's fused passes stay in cache and
# measured ahead of the kernel's forward and backward (the 2-core
# development machine, back-to-back probes, docs/benchmarks.md "CPU, small
# problems at W <= 4", 2026-11-27): XLA for the whole op
# (forward and backward)
# - W = 1 (also with states) up to 2^21 (training step 0.49-0.70x XLA's
#   speed at 2^19, 0.52-0.66x at 2^20, 0.82-0.97x at 2^21; at 2^22 the
#   kernel 1.5-2.2x faster);
# - W = 2 without states, seq_idx up to 2^20 (0.67-0.70x at 2^19, 0.89x at
#   2^20), dense up to 2^19 (0.86x bfloat16, level in float32; at 2^20 the
#   kernel 1.17x faster);
# and the forward alone (nothing differentiates it) with seq_idx at W >= 3,
# by x's dtype, up to the elements and width of one of its entries in
# CPU_XLA_SEQ_IDX_FORWARD (a packed row's short segments: XLA ahead or
# level up to these widths, the kernel ahead past them; docs/benchmarks.md
# "CPU, packed segments in one pass").
CPU_XLA_MAX_ELEMENTS = {"w1": 1 << 21, "w2_seq_idx": 1 << 20, "w2_dense": 1 << 19}
CPU_XLA_SEQ_IDX_FORWARD = {  # dtype: {max elements: max W}
    "bfloat16": {1 << 19: 8}, "float16": {1 << 21: 24}, "float32": {1 << 19: 20, 1 << 21: 8},
    "float64": {1 << 19: 20, 1 << 21: 5}}

# A forward that nothing differentiates at W <= 2 without states (any
# layout, dense or seq_idx) takes XLA's fused pass while x is at most this
# many bytes; past it the kernel (the 2-core development machine, 40-200
# alternating calls, 2026-11-27: at 2^22 elements XLA level or up to 2x
# faster in most cells; at 32-128 MiB the kernel 1.3-2.2x faster in every
# layout, dtype and mode measured; docs/benchmarks.md "CPU, the short
# forward by size").
CPU_XLA_FORWARD_MAX_BYTES = 16 << 20


def cpu_kernel_wins(cfg, width: int, has_initial_states: bool, dtype, backward: bool = False,
                    elements: int = 0) -> bool:
    """False where the XLA twin is faster on the CPU (docs/benchmarks.md,
    CPU sections; measured on the 2-core development machine; `elements`:
    x's B * D * L, 0 if unknown):
    - W = 1, channels-first, float32 / float64, without states (dense or
      seq_idx): the whole op, forward and backward. A per-channel scale
      that XLA fuses into one pass with its backward; ours is two. (16-bit
      types and channels-last: the kernel, well ahead of XLA there.)
    - a forward that nothing differentiates at W <= 2 without states (dense
      or seq_idx, either layout) of x up to CPU_XLA_FORWARD_MAX_BYTES (or
      of unknown size), where XLA's one fused elementwise pass is level
      with the kernel or ahead of it while x stays in cache. In a training
      step the kernel's forward stays there: XLA's forward beside our
      backward measured slower.
    - small channels-first problems (CPU_XLA_MAX_ELEMENTS): W = 1 and 2, the
      whole op; the seq_idx forward alone at W >= 3 up to bounds by dtype
      (CPU_XLA_SEQ_IDX_FORWARD).
    Elsewhere the kernel (the backward faster at every other measured cell)."""
    plain = cfg.mode != VARLEN and not has_initial_states and not cfg.want_final
    if width == 1 and plain and not cfg.channels_last and jnp.dtype(dtype) in (jnp.float32, jnp.float64):
        return False
    if not cfg.channels_last and cfg.mode != VARLEN and 0 < elements:
        small = CPU_XLA_MAX_ELEMENTS
        if width == 1 and elements <= small["w1"]:
            return False
        if width == 2 and plain and elements <= small["w2_seq_idx" if cfg.mode == SEQ_IDX else "w2_dense"]:
            return False
        bounds = CPU_XLA_SEQ_IDX_FORWARD.get(jnp.dtype(dtype).name, {})
        if (width >= 3 and cfg.mode == SEQ_IDX and not backward and not cfg.differentiated
                and any(elements <= n and width <= top for n, top in bounds.items())):
            return False
    cached = elements == 0 or elements * jnp.dtype(dtype).itemsize <= CPU_XLA_FORWARD_MAX_BYTES
    return backward or cfg.differentiated or not (width <= 2 and plain and cached)
