"""The conv benchmark matrix's cells and their floors (no timing here).

A cell is one problem: shape (B, D, L), width W, dtype, layout and mode.
Each cell is timed three ways (passes): the forward, the backward alone,
and a training step that keeps the forward (y returned beside the grads).

Floors. Each pass must move some bytes and do some fused multiply-adds:

- bytes (s = the dtype's size, N = B*D*L):
  forward  = read x + write y = 2*N*s
             + seq_idx read (B*L*4, int32) when the mode is seq_idx
             + initial states read and final states written (2 * B*D*(W-1)*s) in the states mode
             + weight and bias read ((D*W + D)*s)
  backward = read x and dy, write dx = 3*N*s
             + seq_idx read (B*L*4) in the seq_idx mode
             + initial states and d(final states) read, d(initial states) written
               (3 * B*D*(W-1)*s) in the states mode
             + weight and bias read, their gradients written (2*(D*W + D)*s)
  step     = forward + backward
- FMAs: forward B*D*L*W, backward 2x that (dx and dweight), step 3x.

copy floor = bytes / copy bandwidth, the bandwidth measured in the same run
(a large jitted ``-x`` pass: 2 * its bytes / its time); FMA floor = FMAs /
the float32 FMA rate measured in the same run (a large float32 matmul at
``precision=HIGHEST``, so no TF32: M*N*K / its time; on NVIDIA GPUs that is
cuBLAS's SGEMM, the run records which GEMM XLA picked). floor = max of the
two.
"""

from __future__ import annotations

import dataclasses

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64, 128)
# GPU only: a width of the wide family's (W > 16) that is not a multiple of 16
GPU_EXTRA_WIDTHS = (24,)
F32_WIDTHS = (4, 8, 64)
SMALL_WIDTHS = (4, 8)
LAYOUTS = ("cf", "cl")
MODES = ("dense", "seq_idx", "states")
DTYPES = ("bfloat16", "float32")
PASSES = ("fwd", "bwd", "step")
IMPLS = ("ours", "xla")

LAYOUT_NAMES = {"cf": "channels-first", "cl": "channels-last"}
MODE_NAMES = {"dense": "dense", "seq_idx": "seq_idx (8 segments, padded tail)",
              "states": "initial + final states"}
PASS_NAMES = {"fwd": "forward", "bwd": "backward", "step": "training step"}
IMPL_NAMES = {"ours": "ours", "xla": "XLA shifted sum"}

# (B, D, L): the full width list at the large shapes, W in SMALL_WIDTHS at the
# small, launch-bound ones.
SHAPES = {
    "gpu": {"big": ((8, 4096, 4096), (4, 2048, 16384)),
            "small": ((32, 512, 1024), (1, 8192, 2048))},
    "cpu": {"big": ((4, 256, 4096),), "small": ((16, 64, 512),)},
}

SEGMENTS = 8            # seq_idx: segments per row
PAD_FRACTION = 0.05     # seq_idx: the last ~5% of each row is padding (id -1)

_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "f32": "float32", "float32": "float32",
    "cf": "cf", "channels-first": "cf", "channels_first": "cf",
    "cl": "cl", "channels-last": "cl", "channels_last": "cl",
    "dense": "dense", "seq_idx": "seq_idx", "seq-idx": "seq_idx", "states": "states",
    "fwd": "fwd", "forward": "fwd", "bwd": "bwd", "backward": "bwd", "step": "step",
    "ours": "ours", "xla": "xla",
}


@dataclasses.dataclass(frozen=True, order=True)
class Cell:
    B: int
    D: int
    L: int
    dtype: str
    layout: str
    mode: str
    W: int

    @property
    def shape(self):
        return (self.B, self.D, self.L)

    @property
    def x_shape(self):
        return (self.B, self.L, self.D) if self.layout == "cl" else (self.B, self.D, self.L)

    @property
    def state_shape(self):
        k = self.W - 1
        return (self.B, k, self.D) if self.layout == "cl" else (self.B, self.D, k)

    @property
    def itemsize(self):
        return {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8}[self.dtype]

    def key(self):
        return dataclasses.asdict(self)

    def label(self):
        return (f"({self.B},{self.D},{self.L}) {short_dtype(self.dtype)} {self.layout} "
                f"{self.mode} W={self.W}")


def short_dtype(dtype):
    return {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}.get(dtype, dtype)


def parse_list(text, what, allowed=None):
    """'a,b' -> canonical names; ValueError naming `what` on an unknown one."""
    if text is None:
        return None
    out = []
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        name = _ALIASES.get(item.lower())
        if name is None or (allowed is not None and name not in allowed):
            raise ValueError(f"--{what}: unknown value {item!r} (expected one of "
                             f"{', '.join(allowed or sorted(set(_ALIASES.values())))})")
        out.append(name)
    return out


def parse_widths(text):
    if text is None:
        return None
    try:
        ws = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--widths: expected comma-separated integers, got {text!r}") from None
    if any(w < 1 for w in ws):
        raise ValueError(f"--widths: widths must be >= 1, got {text!r}")
    return ws


def parse_shapes(text, platform):
    """'8x4096x4096,small' -> [((B, D, L), kind)]; kind 'big' or 'small'
    picks the widths (a shape outside the platform's set counts as big)."""
    if text is None:
        return None
    table = SHAPES[platform]
    out = []
    for item in (t.strip().lower() for t in str(text).split(",")):
        if item in table:
            out += [(s, item) for s in table[item]]
            continue
        try:
            shape = tuple(int(v) for v in item.split("x"))
        except ValueError:
            shape = ()
        if len(shape) != 3 or min(shape) < 1:
            raise ValueError(f"--shapes: expected BxDxL (e.g. 8x4096x4096), 'big' or 'small', "
                             f"got {item!r}")
        out.append((shape, "small" if shape in table["small"] else "big"))
    return out


def cells(platform, widths=None, layouts=None, modes=None, dtypes=None, shapes=None):
    """The matrix for `platform` ("gpu" or "cpu"), narrowed by the filters
    (lists of canonical names; shapes as parse_shapes gives them), ordered so
    that cells sharing inputs are adjacent: shape, dtype, layout, mode, W."""
    table = SHAPES[platform]
    shapes = shapes or [(s, k) for k in ("big", "small") for s in table[k]]
    out = []
    for (B, D, L), kind in shapes:
        for dt in DTYPES:
            if dtypes is not None and dt not in dtypes:
                continue
            if kind == "small":
                ws = SMALL_WIDTHS if dt == "bfloat16" else ()
            else:
                ws = WIDTHS if dt == "bfloat16" else F32_WIDTHS
                if dt == "bfloat16" and platform == "gpu":
                    ws = tuple(sorted(ws + GPU_EXTRA_WIDTHS))
            # widths asked for replace the list of each dtype measured at this
            # kind of shape (or asked for), even where the matrix lacks the width
            if widths is not None and (ws or dtypes is not None):
                ws = list(widths)
            for lay in LAYOUTS:
                if layouts is not None and lay not in layouts:
                    continue
                for mode in MODES:
                    if modes is not None and mode not in modes:
                        continue
                    out += [Cell(B, D, L, dt, lay, mode, w) for w in ws]
    return out


def bytes_moved(cell, pas):
    """Bytes the pass must read and write at least (see the module docstring)."""
    s, N = cell.itemsize, cell.B * cell.D * cell.L
    sid = cell.B * cell.L * 4 if cell.mode == "seq_idx" else 0
    st = cell.B * cell.D * (cell.W - 1) * s if cell.mode == "states" else 0
    params = (cell.D * cell.W + cell.D) * s
    fwd = 2 * N * s + sid + 2 * st + params
    bwd = 3 * N * s + sid + 3 * st + 2 * params
    return {"fwd": fwd, "bwd": bwd, "step": fwd + bwd}[pas]


def fmas(cell, pas):
    return cell.B * cell.D * cell.L * cell.W * {"fwd": 1, "bwd": 2, "step": 3}[pas]


def floor_s(cell, pas, copy_bytes_per_s, fma_per_s):
    """(floor seconds, 'copy' or 'fma'): the larger of the two floors."""
    copy = bytes_moved(cell, pas) / copy_bytes_per_s
    fma = fmas(cell, pas) / fma_per_s
    return (copy, "copy") if copy >= fma else (fma, "fma")


def seq_idx_row(L, segments=SEGMENTS, pad_fraction=PAD_FRACTION):
    """One row of seq_idx: ids 0..segments-1 in equal runs over the first
    (1 - pad_fraction) of the row, then -1 (padding) to the end."""
    valid = max(1, L - int(round(L * pad_fraction)))
    return [min(t * segments // valid, segments - 1) if t < valid else -1 for t in range(L)]


# Records (the JSON that conv_matrix writes: key, calib, times) -> cells and floors.

def cell_of(rec):
    return Cell(**rec["key"])


def primary(t):
    """(microseconds, source) of one timed pass: device time where measured, else wall."""
    return (t["dev_us"], "device") if t.get("dev_us") is not None else (t["wall_us"], "wall")


def pass_run(rec, pas):
    """(calib, meta) of the run that timed pass `pas` of the record (a pass
    kept from an earlier run by report.merge_record has its own)."""
    run = rec.get("pass_runs", {}).get(pas)
    return (run["calib"], run["meta"]) if run else (rec["calib"], rec["meta"])


def floor_us(rec, pas):
    """(floor in microseconds, 'copy' or 'fma') with the rates of the run that timed the pass."""
    cal, _ = pass_run(rec, pas)
    s, kind = floor_s(cell_of(rec), pas, cal["copy_bytes_per_s"], cal["fma_per_s"])
    return s * 1e6, kind
