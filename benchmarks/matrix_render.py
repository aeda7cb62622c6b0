"""Markdown, target checks and the width plot for the conv matrix's records
(no timing here: it all works from the JSON that conv_matrix writes)."""

from __future__ import annotations

import os
import sys

from . import matrix_cells as mc
from .matrix_cells import cell_of, floor_us, primary
from .matrix_plot import plot_width
from .report import emit, fmt_us, heading, md_table

# Issue 17 part 2 (GPU targets). The CPU is held to the first only.
FWD_FLOOR_TARGETS = ((16, 0.90), (64, 0.75), (None, 0.50))   # (max W, fraction of floor)
STEP_FLOOR_MAX = 1.10        # step time / its floor, W <= 8
STEP_FLOOR_WIDTH = 8
SEQ_IDX_OVER_DENSE = 1.05    # seq_idx time / dense time, same width


def fwd_floor_target(W):
    for wmax, frac in FWD_FLOOR_TARGETS:
        if wmax is None or W <= wmax:
            return frac


def slower_than_xla(rec):
    """[(pass, {metric: ours/xla})] where ours is slower than the XLA shifted sum."""
    out = []
    ours, xla = rec["times"].get("ours", {}), rec["times"].get("xla", {})
    for pas in mc.PASSES:
        if pas not in ours or pas not in xla:
            continue
        slow = {m: ours[pas][m] / xla[pas][m] for m in ("dev_us", "wall_us")
                if ours[pas].get(m) is not None and xla[pas].get(m) is not None
                and ours[pas][m] > xla[pas][m]}
        if slow:
            out.append((pas, slow))
    return out


def _ratios(slow):
    """'device 1.02x, wall 1.10x' from one pass of slower_than_xla."""
    return ", ".join(f"{'device' if m == 'dev_us' else 'wall'} {v:.2f}x" for m, v in slow.items())


def auto_route(cell, pas, platform):
    """What ``backend="auto"`` runs for this cell's pass on the platform:
    "XLA", "kernel", or for a training step that splits, which half takes
    which (the routing rules of jax_causal_conv/_lowering/routing.py, read
    with the cell's shapes; the matrix itself times backend="ffi")."""
    from jax_causal_conv._lowering import routing
    from jax_causal_conv._lowering.config import ROWS, SEQ_IDX, ConvConfig

    states = cell.mode == "states"

    def kernel(backward, differentiated):
        cfg = ConvConfig(activation="silu", mode=SEQ_IDX if cell.mode == "seq_idx" else ROWS,
                         channels_last=cell.layout == "cl", states_channels_last=cell.layout == "cl",
                         want_final=states, backend="auto", differentiated=differentiated)
        if platform == "gpu":
            return routing.gpu_kernel_wins(cfg, cell.W, cell.L, cell.itemsize, cell.B, cell.D,
                                           backward, states)
        return routing.cpu_kernel_wins(cfg, cell.W, states, cell.dtype, backward,
                                       cell.B * cell.D * cell.L)

    name = {True: "kernel", False: "XLA"}
    if pas == "fwd":
        return name[kernel(False, False)]
    if pas == "bwd":
        return name[kernel(True, True)]
    f, b = kernel(False, True), kernel(True, True)
    return name[f] if f == b else f"{name[f]} forward, {name[b]} backward"


# The targets, in the order of the summary table.
TARGETS = {
    "xla": "fwd and step no slower than the XLA shifted sum",
    "fwd": "fwd at its floor fraction (90% W <= 16, 75% to 64, 50% above)",
    "step": f"step <= {STEP_FLOOR_MAX:.2f}x its floor (W <= {STEP_FLOOR_WIDTH})",
    "seq": f"seq_idx fwd and step <= {SEQ_IDX_OVER_DENSE:.2f}x dense's time",
}


def target_checks(records):
    """(cell, target, misses) for every target that applies to a cell
    (TARGETS' keys; misses: a text for each way the cell misses it, by how
    much; empty where it meets it)."""
    dense = {}
    for r in records:
        c = cell_of(r)
        if c.mode == "dense":
            dense[(c.B, c.D, c.L, c.dtype, c.layout, c.W)] = r
    for r in records:
        c, ours = cell_of(r), r["times"].get("ours", {})
        slow = dict(slower_than_xla(r))
        if any(p in ours for p in ("fwd", "step")):
            texts = [f"{pas} slower than the XLA shifted sum ({_ratios(slow[pas])} its time)"
                     for pas in ("fwd", "step") if pas in slow]
            yield c, "xla", texts
        if c.mode not in ("dense", "seq_idx"):
            continue
        if "fwd" in ours:
            frac = floor_us(r, "fwd")[0] / primary(ours["fwd"])[0]
            want = fwd_floor_target(c.W)
            yield c, "fwd", ([f"fwd at {frac:.0%} of its floor (target >= {want:.0%})"]
                             if frac < want else [])
        if "step" in ours and c.W <= STEP_FLOOR_WIDTH:
            ratio = primary(ours["step"])[0] / floor_us(r, "step")[0]
            yield c, "step", ([f"step at {ratio:.2f}x its floor (target <= {STEP_FLOOR_MAX:.2f}x)"]
                              if ratio > STEP_FLOOR_MAX else [])
        d = dense.get((c.B, c.D, c.L, c.dtype, c.layout, c.W))
        if c.mode == "seq_idx" and d is not None:
            texts, checked = [], False
            for pas in ("fwd", "step"):
                if pas in ours and pas in d["times"].get("ours", {}):
                    checked = True
                    ratio = primary(ours[pas])[0] / primary(d["times"]["ours"][pas])[0]
                    if ratio > SEQ_IDX_OVER_DENSE:
                        texts.append(f"seq_idx {pas} {ratio:.2f}x dense's time "
                                     f"(target <= {SEQ_IDX_OVER_DENSE:.2f}x)")
            if checked:
                yield c, "seq", texts


def target_misses(records):
    """[(cell, text)] for every cell missing one of issue 17's GPU targets."""
    return [(c, text) for c, _, misses in target_checks(records) for text in misses]


def _widths(ws):
    """'1..3, 5, 8' from a set of widths (runs of three or more joined)."""
    runs = []
    for w in sorted(ws):
        if runs and w == runs[-1][-1] + 1:
            runs[-1].append(w)
        else:
            runs.append([w])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def target_summary(records):
    """Markdown table: per target and (layout, mode), the cells that meet it
    of those it applies to, and where it is missed (W by shape and dtype)."""
    tally = {}
    for c, key, misses in target_checks(records):
        t = tally.setdefault((key, c.layout, c.mode), {"n": 0, "miss": {}})
        t["n"] += 1
        if misses:
            t["miss"].setdefault((c.B, c.D, c.L, c.dtype), set()).add(c.W)
    rows = []
    for key, what in TARGETS.items():
        for layout in mc.LAYOUTS:
            for mode in mc.MODES:
                t = tally.get((key, layout, mode))
                if t is None:
                    continue
                nmiss = sum(len(v) for v in t["miss"].values())
                where = "; ".join(f"W {_widths(ws)} at ({B},{D},{L}) {mc.short_dtype(dt)}"
                                  for (B, D, L, dt), ws in sorted(t["miss"].items(),
                                                                  key=lambda kv: (-kv[0][0] * kv[0][1] * kv[0][2],
                                                                                  kv[0])))
                rows.append([what, layout, mode, f"{t['n'] - nmiss} of {t['n']}", where or "—"])
    return md_table(["target", "layout", "mode", "cells meeting it", "missed at"], rows, right=[3])


def _time_cell(t, dev):
    if t is None:
        return "—"
    return f"{fmt_us(t.get('dev_us'))} ({fmt_us(t['wall_us'])})" if dev else fmt_us(t["wall_us"])


def _ratio_cell(o, x, dev):
    if o is None or x is None:
        return "—"
    wall = f"{x['wall_us'] / o['wall_us']:.2f}"
    if not dev:
        return wall
    r = (f"{x['dev_us'] / o['dev_us']:.2f}" if o.get("dev_us") and x.get("dev_us") is not None
         else "—")
    return f"{r} ({wall})"


def table(recs, dev):
    """Rows (layout, mode, W) of one shape and dtype."""
    header = ["layout", "mode", "W"]
    for pas in mc.PASSES:
        header += [f"{pas} µs", f"{pas} % floor", f"{pas} XLA/ours"]
    header.append("floors µs fwd / bwd / step")
    rows = []
    for r in sorted(recs, key=lambda r: (mc.LAYOUTS.index(r["key"]["layout"]),
                                         mc.MODES.index(r["key"]["mode"]), r["key"]["W"])):
        c, ours, xla = cell_of(r), r["times"].get("ours", {}), r["times"].get("xla", {})
        row = [c.layout, c.mode, c.W]
        floors = []
        for pas in mc.PASSES:
            fl, kind = floor_us(r, pas)
            floors.append(f"{fmt_us(fl)}{'c' if kind == 'copy' else 'f'}")
            o = ours.get(pas)
            row += [_time_cell(o, dev),
                    f"{fl / primary(o)[0]:.0%}" if o and primary(o)[0] else "—",
                    _ratio_cell(o, xla.get(pas), dev)]
        row.append(" / ".join(floors))
        rows.append(row)
    return md_table(header, rows, right=range(2, len(header)))


def _runs(recs):
    """(calib, meta) of each run the records' passes come from."""
    seen = {}
    for r in recs:
        runs = [r] + list(r.get("pass_runs", {}).values())
        for cal, m in ((v["calib"], v["meta"]) for v in runs):
            k = (m["date"], m.get("commit"), m.get("sources"), round(cal["copy_bytes_per_s"]))
            seen[k] = (cal, m)
    return list(seen.values())


def render_group(recs, plot_link=None):
    """Markdown for the records of one platform and device."""
    meta = recs[0]["meta"]
    dev = any(t.get("dev_us") is not None for r in recs for p in r["times"].values()
              for t in p.values())
    out = [heading(meta, "Conv matrix"), ""]
    for cal, m in _runs(recs):
        out.append(f"- run of {m['date']} (jax {m['jax']}"
                   + (f", commit {m['commit']}" if m.get("commit") else "")
                   + (f", kernel sources {m['sources']}" if m.get("sources") else "") + f"): copy "
                   f"bandwidth {cal['copy_bytes_per_s'] / 1e9:.1f} GB/s ({cal['time_source']} "
                   f"time of an in-place `-x` pass over {cal['copy_bytes'] / 2 ** 21:.0f} MiB, read "
                   f"and written), "
                   f"float32 FMA rate {cal['fma_per_s'] / 1e12:.3f} T/s ({cal['gemm']}, "
                   f"{cal['gemm_size']}^3, precision HIGHEST)")
    out += ["", ("Times in µs per call: device time from the profiler, wall time in "
                 "parentheses; '% floor' and 'XLA/ours' (XLA's time / ours, > 1: ours faster) "
                 "from device time, wall in parentheses." if dev else
                 "Times in µs per call (wall time); '% floor' = floor / time; 'XLA/ours' = "
                 "the XLA shifted sum's time / ours (> 1: ours faster)."),
            "Floors: 'c' copy-bound, 'f' FMA-bound (see Method). Layout cf = channels-first "
            "(B, D, L), cl = channels-last (B, L, D).", ""]
    if plot_link:
        out += [f"![time against width]({plot_link})", ""]
    groups = {}
    for r in recs:
        c = cell_of(r)
        groups.setdefault((c.B, c.D, c.L, c.dtype), []).append(r)
    for (B, D, L, dt), rs in sorted(groups.items(), key=lambda kv: (-kv[0][0] * kv[0][1] * kv[0][2],
                                                                    kv[0])):
        n = rs[0].get("n_calls", 1)
        extra = f", {n} independent calls per program" if n > 1 else ""
        out += [f"#### (B, D, L) = ({B}, {D}, {L}), {dt}{extra}", ""] + table(rs, dev) + [""]
    slow = [(cell_of(r), pas, s) for r in recs for pas, s in slower_than_xla(r)]
    out.append(f"Cells where ours is slower than the XLA shifted sum (any pass, device or wall "
               f"time): {len(slow) or 'none'}.")
    for c, pas, s in sorted(slow, key=lambda t: (t[0], t[1])):
        out.append(f"- {c.label()}: {pas} ({_ratios(s)} XLA's time); backend=\"auto\" runs "
                   f"{auto_route(c, pas, meta['platform'])} here")
    errs = [(cell_of(r), k, e) for r in recs for k, e in sorted(r.get("errors", {}).items())]
    if errs:
        out += ["", f"Programs that failed (no time; '—' in the tables): {len(errs)}."]
        out += [f"- {c.label()}: {k}: {e}" for c, k, e in sorted(errs, key=lambda t: t[0])]
    if meta["platform"] == "gpu":
        out += ["", "Issue 17's targets by layout and mode (every shape and dtype measured; "
                "the list below gives each miss):", ""] + target_summary(recs)
        miss = target_misses(recs)
        out += ["", f"Cells missing issue 17's targets: {len(miss) or 'none'}."]
        out += [f"- {c.label()}: {why}" for c, why in sorted(miss, key=lambda t: t[0])]
    extra_ops = {}
    for r in recs:
        for k, census in r.get("hlo", {}).items():
            if k.startswith("ours/") and census["other"]:
                for op, cnt in census["other"].items():
                    extra_ops.setdefault(k, {}).setdefault(op, set()).add(cnt)
    out += ["", "Compiled programs (checked when measured): ours' forward makes one forward "
            "call per call, its backward one backward call and no forward, its training step "
            "one of each; the XLA programs call none of ours. Other ops in ours' programs: "
            + ("; ".join(f"{k}: " + ", ".join(f"{op}" for op in sorted(v))
                         for k, v in sorted(extra_ops.items())) or "none") + "."]
    return "\n".join(out) + "\n"


def by_platform(records):
    out = {}
    for r in records:
        if r.get("kind") == "conv_matrix":
            out.setdefault(r["meta"]["platform"], {}).setdefault(r["meta"]["device"], []).append(r)
    return out


def publish(records, output=None, plot=None, log=None):
    """Markdown per platform to stdout or into `output` (marker
    '<platform>-matrix'), and the width plot (next to `output` by default)."""
    log = log or (lambda s: print(s, file=sys.stderr))
    for platform, devices in by_platform(records).items():
        path = plot or (os.path.join(os.path.dirname(output) or ".",
                                     f"benchmarks-{platform}-width.png") if output else None)
        if plot and len(by_platform(records)) > 1:
            root, ext = os.path.splitext(plot)
            path = f"{root}-{platform}{ext}"
        link = None
        if path:
            recs = [r for rs in devices.values() for r in rs]
            if plot_width(recs, path, log):
                link = os.path.relpath(path, os.path.dirname(output) or ".") if output else path
        text = "\n".join(render_group(rs, link) for rs in devices.values())
        emit(text, output, f"{platform}-matrix")
