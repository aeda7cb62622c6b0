"""The conv benchmark matrix: ours against its floor and the jitted XLA
shifted sum, per width x layout x mode x dtype x shape (matrix_cells.py
lists the cells and defines the floors).

    python -m benchmarks.conv_matrix --platform gpu --json $OUT/m.json --widths 1,2,3,4
    python -m benchmarks.conv_matrix --render a.json b.json --output docs/benchmarks.md
    python -m benchmarks.conv_matrix --platform cpu --output docs/benchmarks.md

Three passes per cell, each one jitted program compiled once:
- fwd:  y = f(x, w, b)
- bwd:  the backward alone: ``jax.vjp(f, ...)[1](dy)``; XLA drops the
        forward (nothing uses y), so for ours the program is our backward
        custom call fed x and dy (checked in the compiled HLO);
- step: ``y, vjp = jax.vjp(f, ...)``, returning y beside ``vjp(dy)``: the
        forward is kept (checked: the compiled HLO holds our forward call).
SiLU and bias on. Wall time (samples of back-to-back calls) and, on a GPU,
device time (kernels' busy time from the JAX profiler). The copy bandwidth
and the float32 FMA rate that the floors use are measured at the start of
every run. Each cell is appended to --json as soon as it is measured.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

import jax_causal_conv as jcc
from jax_causal_conv._lowering import targets
from jax_causal_conv.cli.bench_options import add_arguments, resolve_platform
from jax_causal_conv.cli.progress import Progress

from . import matrix_cells as mc
from .report import append_records, load_records, run_meta
from .timing import device_times, timeit, timeit_interleaved

# reps: wall samples per program (at most); min_sample_s: back-to-back calls
# per sample until it lasts that long; max_s: fewer samples (>= 3) past that
# many seconds per program; trace_iters: runs per program in the profiler
# trace (0: no device time); batch_below: inputs smaller than this are timed
# as n_batched independent calls in one program (distinct inputs, so the
# cache does not serve them).
PROFILES = {
    "gpu": dict(reps=7, min_sample_s=0.01, max_s=0.25, trace_iters=5,
                batch_below=64 << 20, n_batched=16, copy_elems=1 << 27, gemm=4096),
    "cpu": dict(reps=5, min_sample_s=0.0, max_s=1.0, trace_iters=0,
                batch_below=0, n_batched=1, copy_elems=1 << 24, gemm=1024),
}

_TRIVIAL = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "call",
            "custom-call"}
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')


def hlo_census(text):
    """From compiled HLO text: how many of our forward / backward custom
    calls it makes, and the other (non-bookkeeping) ops outside fused
    computations and reduction regions, counted by opcode."""
    fwd = bwd = 0
    other = {}
    skip = False
    for line in text.splitlines():
        s = line.strip()
        if s.endswith("{") and ("(" in s or s.startswith(("%", "ENTRY"))):  # computation header
            name = s.split()[1] if s.startswith("ENTRY") else s.split()[0]
            skip = "fused" in name or "region" in name or "wrapped" in name
            continue
        for t in _TARGET.findall(s):  # wherever XLA put the call (command buffers too)
            fwd += t == targets.FORWARD
            bwd += t == targets.BACKWARD
        if skip:
            continue
        m = _INSTR.match(s)
        if m and m.group(1) not in _TRIVIAL:
            other[m.group(1)] = other.get(m.group(1), 0) + 1
    return dict(forward=fwd, backward=bwd, other=other)


def check_hlo(impl, pas, census, n):
    """AssertionError unless the program calls exactly the kernels its pass
    claims to time: ours fwd = n forward calls; bwd = n backward calls and
    no forward; step = n of each (the forward kept). The XLA baseline calls
    none of ours."""
    want = {"fwd": (n, 0), "bwd": (0, n), "step": (n, n)}[pas] if impl == "ours" else (0, 0)
    got = (census["forward"], census["backward"])
    if got != want:
        raise AssertionError(
            f"{impl} {pas}: the compiled program makes {got[0]} forward and {got[1]} backward "
            f"calls of our kernels, expected {want[0]} and {want[1]}"
            + (" (the training step lost its forward: XLA dropped an unused y)"
               if impl == "ours" and pas == "step" and got[0] < n else ""))


def conv_fn(impl, cell):
    """f(x, w, b, seq_idx, init) -> y, or (y, final_states) in the states mode.
    impl "ours" forces the kernel, "xla" the shifted sum; "auto" routes as a
    user's call does (not timed; the tests check matrix_render.auto_route
    against it)."""
    backend = {"ours": "ffi", "xla": "xla", "auto": "auto"}[impl]

    def f(x, w, b, seq, init):
        return jcc.causal_conv1d(x, w, b, activation="silu", seq_idx=seq, initial_states=init,
                                 return_final_states=init is not None,
                                 channels_last=cell.layout == "cl", backend=backend)
    return f


def pass_fn(impl, cell, pas):
    """single(x, w, b, seq, init, dy, dfin) for one call of the pass."""
    f = conv_fn(impl, cell)

    def single(x, w, b, seq, init, dy, dfin):
        if pas == "fwd":
            return f(x, w, b, seq, init)
        primals = (x, w, b) if init is None else (x, w, b, init)
        y, vjp = jax.vjp(lambda *p: f(*p[:3], seq, p[3] if len(p) > 3 else None), *primals)
        grads = vjp(dy if init is None else (dy, dfin))
        return grads if pas == "bwd" else (y, grads)
    return single


def program(single, n):
    """One jitted program of n independent calls, on n distinct inputs."""
    def prog(xs, w, b, seq, inits, dys, dfins):
        return [single(xs[i], w, b, seq, None if inits is None else inits[i],
                       None if dys is None else dys[i], None if dfins is None else dfins[i])
                for i in range(n)]
    return jax.jit(prog)


class Inputs:
    """Random inputs (never zeros), made on the device and reused across the
    cells that share them; dropped when the shape, dtype or layout changes."""

    def __init__(self, n_for):
        self.n_for, self.cache, self.group = n_for, {}, None

    def _rand(self, tag, shape, dtype, scale=1.0):
        k = (tag, shape, dtype)
        if k not in self.cache:
            key = jax.random.fold_in(jax.random.key(7), zlib.crc32(repr(k).encode()) % (1 << 30))
            self.cache[k] = (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)
        return self.cache[k]

    def get(self, cell):
        group = (cell.shape, cell.dtype, cell.layout)
        if group != self.group:
            self.cache, self.group = {}, group
        dt, n = jnp.dtype(cell.dtype), self.n_for(cell)
        xs = tuple(self._rand(("x", i), cell.x_shape, dt) for i in range(n))
        dys = tuple(self._rand(("dy", i), cell.x_shape, dt) for i in range(n))
        w = self._rand("w", (cell.D, cell.W), dt, cell.W ** -0.5)
        b = self._rand("b", (cell.D,), dt)
        seq = inits = dfins = None
        if cell.mode == "seq_idx":
            k = ("seq", cell.B, cell.L)
            if k not in self.cache:
                row = np.asarray(mc.seq_idx_row(cell.L), np.int32)
                self.cache[k] = jnp.asarray(np.broadcast_to(row, (cell.B, cell.L)).copy())
            seq = self.cache[k]
        if cell.mode == "states":
            inits = tuple(self._rand(("init", i), cell.state_shape, dt) for i in range(n))
            dfins = tuple(self._rand(("dfin", i), cell.state_shape, dt) for i in range(n))
        return dict(xs=xs, w=w, b=b, seq=seq, inits=inits, dys=dys, dfins=dfins), n


def calibrate(platform, prof, log=print):
    """The copy bandwidth and the float32 FMA rate, measured now."""
    n, M = prof["copy_elems"], prof["gemm"]
    k = jax.random.split(jax.random.key(1), 3)
    # In place (donated), so that no fresh output is allocated per call: on a
    # CPU the page faults of a new 64 MiB output cost more than the copy.
    neg = jax.jit(lambda x: -x, donate_argnums=0)
    box = [jax.random.normal(k[0], (n,), jnp.float32)]

    def copy():
        box[0] = neg(box[0])
        return box[0]
    span = dict(reps=prof["reps"], warmup=2, min_sample_s=prof["min_sample_s"], max_s=1.0)
    t_wall = timeit(copy, **span)
    dev = device_times({"copy": (copy, (), 1)}, n=prof["trace_iters"], log=log) \
        if prof["trace_iters"] else {}
    t_copy = dev["copy"] * 1e-6 if dev else t_wall
    a = jax.random.normal(k[1], (M, M), jnp.float32)
    b = jax.random.normal(k[2], (M, M), jnp.float32)
    mm = jax.jit(lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST))
    hlo = mm.lower(a, b).compile().as_text()
    gemm = ("cuBLAS (SGEMM)" if "cublas" in hlo else "Triton GEMM" if "triton" in hlo
            else "XLA:CPU dot" if platform == "cpu" else "XLA dot")
    t_mm_wall = timeit(mm, a, b, **span)
    devm = device_times({"mm": (mm, (a, b), 1)}, n=prof["trace_iters"], log=log) \
        if prof["trace_iters"] else {}
    t_mm = devm["mm"] * 1e-6 if devm else t_mm_wall
    cal = dict(copy_bytes_per_s=2 * n * 4 / t_copy, copy_wall_bytes_per_s=2 * n * 4 / t_wall,
               copy_bytes=2 * n * 4, time_source="device" if dev else "wall",
               fma_per_s=M ** 3 / t_mm, fma_wall_per_s=M ** 3 / t_mm_wall, gemm=gemm, gemm_size=M)
    log(f"calibration: copy {cal['copy_bytes_per_s'] / 1e9:.1f} GB/s ({cal['time_source']} time; "
        f"wall {cal['copy_wall_bytes_per_s'] / 1e9:.1f}), float32 FMA "
        f"{cal['fma_per_s'] / 1e12:.3f} T/s ({gemm}, {M}^3)")
    return cal


def measure_cell(cell, impls, passes, inputs, prof, log=print):
    """One cell: compile each (impl, pass) once, check its HLO, run it once,
    then wall time each, then one profiler trace for all of them."""
    t0 = time.perf_counter()
    arrs, n = inputs.get(cell)
    progs, hlo, times = {}, {}, {}
    lowered = {}
    for impl in impls:
        for pas in passes:
            args = (arrs["xs"], arrs["w"], arrs["b"], arrs["seq"], arrs["inits"],
                    None if pas == "fwd" else arrs["dys"], None if pas == "fwd" else arrs["dfins"])
            lowered[(impl, pas)] = (program(pass_fn(impl, cell, pas), n).lower(*args), args)
    # XLA compiles in C++ without the GIL: the cell's programs compile side by
    # side (the XLA baseline's wide backward takes seconds).
    def compile_one(la):
        try:
            return la[0].compile()
        except Exception as e:  # noqa: BLE001  (reported with the cell below)
            return e
    with ThreadPoolExecutor(max_workers=len(lowered)) as pool:
        compiled = dict(zip(lowered, pool.map(compile_one, lowered.values())))
    errors = {}
    for (impl, pas), (_, args) in lowered.items():
        c = compiled[(impl, pas)]
        try:
            if isinstance(c, Exception):
                raise c
            census = hlo_census(c.as_text())
            check_hlo(impl, pas, census, n)     # an AssertionError stops the run
            jax.block_until_ready(c(*args))
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001  (e.g. out of memory: the other programs go on)
            errors[f"{impl}/{pas}"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
            log(f"{cell.label()}: {impl} {pas} failed: {errors[f'{impl}/{pas}']}")
            continue
        progs[(impl, pas)] = (c, args, n)
        hlo[f"{impl}/{pas}"] = census
    t1 = time.perf_counter()
    wall = timeit_interleaved(progs, reps=prof["reps"], min_sample_s=prof["min_sample_s"],
                              max_s=prof["max_s"])
    for (impl, pas), t in wall.items():
        times.setdefault(impl, {})[pas] = {"wall_us": t * 1e6}
    t2 = time.perf_counter()
    if prof["trace_iters"]:
        dev = device_times(progs, n=prof["trace_iters"], log=log)
        for (impl, pas), us in dev.items():
            times[impl][pas]["dev_us"] = us
    cost = dict(inputs_compile_first_run=t1 - t0, wall_timing=t2 - t1,
                trace=time.perf_counter() - t2)
    return dict(kind="conv_matrix", key=cell.key(), n_calls=n, times=times, hlo=hlo, cost_s=cost,
                errors=errors)


def cell_line(cell, rec, calib):
    parts = []
    for pas, tt in rec["times"].get("ours", {}).items():
        us = mc.primary(tt)[0]
        fl, _ = mc.floor_s(cell, pas, calib["copy_bytes_per_s"], calib["fma_per_s"])
        x = rec["times"].get("xla", {}).get(pas)
        vs = f" XLA/ours {mc.primary(x)[0] / us:.2f}" if x else ""
        parts.append(f"{pas} {us:9.1f}us {fl * 1e6 / us:4.0%} of floor{vs}")
    return f"{cell.label():38s} " + " | ".join(parts)


def run(platform, cell_list, impls=mc.IMPLS, passes=mc.PASSES, json_path=None, log=None):
    """Measures the cells; returns their records (also appended to json_path
    one by one)."""
    prof = PROFILES[platform]
    records = []
    with jax.default_device(jax.devices(platform)[0]), \
            Progress(len(cell_list), f"conv matrix ({platform})") as p:
        log = log or p.log
        meta = run_meta(platform)
        calib = calibrate(platform, prof, log)
        inputs = Inputs(lambda c: prof["n_batched"] if
                        c.B * c.D * c.L * c.itemsize < prof["batch_below"] else 1)
        for cell in cell_list:
            t0 = time.perf_counter()
            rec = measure_cell(cell, impls, passes, inputs, prof, log)
            rec.update(meta=meta, calib=calib, seconds=time.perf_counter() - t0)
            records.append(rec)
            if json_path:
                append_records(json_path, [rec])
            p.step(f"{cell_line(cell, rec, calib)}  [{rec['seconds']:.1f} s]")
    return records


def parse_filters(args, platform):
    return dict(widths=mc.parse_widths(args.widths),
                layouts=mc.parse_list(args.layouts, "layouts", mc.LAYOUTS),
                modes=mc.parse_list(args.modes, "modes", mc.MODES),
                dtypes=mc.parse_list(args.dtypes, "dtypes", mc.DTYPES),
                shapes=mc.parse_shapes(args.shapes, platform))


def build_parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.conv_matrix",
                                description=__doc__.split("\n\n")[0])
    add_arguments(p, suite=False)
    p.add_argument("--render", nargs="+", metavar="JSON",
                   help="no measuring: merge these JSON files and write the markdown")
    p.add_argument("--list", action="store_true", help="list the cells and exit")
    return p


def run_matrix(args, platform):
    """Measure (unless --render), then render: the body of `main` and of the
    suite's matrix section. Returns the records rendered."""
    from . import matrix_render
    if getattr(args, "render", None):
        records = load_records(args.render)
    else:
        cell_list = mc.cells(platform, **parse_filters(args, platform))
        passes = mc.parse_list(args.parts, "parts", mc.PASSES) or mc.PASSES
        new = run(platform, cell_list, passes=passes, json_path=args.json)
        records = load_records([args.json]) if args.json else new
    matrix_render.publish(records, args.output, args.plot)
    return records


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.list:  # no device needed
            platform = args.platform if args.platform in ("cpu", "gpu") else "cpu"
            cl = mc.cells(platform, **parse_filters(args, platform))
            for c in cl:
                print(c.label())
            print(f"{len(cl)} cells", file=sys.stderr)
            return 0
        run_matrix(args, None if args.render else resolve_platform(args.platform))
    except (ValueError, SystemExit) as e:
        if isinstance(e, SystemExit) and not isinstance(e.code, str):
            raise
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
