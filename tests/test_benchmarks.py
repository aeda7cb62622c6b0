"""The benchmark suite's pieces that need no timing: cells, floors, the HLO
checks that each program runs what it claims, rendering, the JSON store,
command lines. (Where a test runs a benchmark end to end it asserts only
the structure of the result, never a time.)"""

import dataclasses
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(ROOT, "benchmarks")):
    pytest.skip("the benchmarks/ folder is not here (not a checkout)", allow_module_level=True)
sys.path.insert(0, ROOT)

import jax_causal_conv as jcc  # noqa: E402
from benchmarks import conv_matrix as cm  # noqa: E402
from benchmarks import matrix_cells as mc  # noqa: E402
from benchmarks import matrix_render as mr  # noqa: E402
from benchmarks import report  # noqa: E402
from jax_causal_conv.cli.progress import Progress  # noqa: E402


# ---- cells -----------------------------------------------------------------

def test_matrix_cells_match_issue_17():
    gpu = mc.cells("gpu")
    # big shapes: 13 widths bf16 (+ W=24, GPU only) + 3 widths f32; small
    # shapes: W 4, 8 bf16; each x 2 layouts x 3 modes
    assert len(gpu) == 2 * (14 + 3) * 6 + 2 * 2 * 6 == 228
    assert len(set(gpu)) == len(gpu)
    assert {c.W for c in gpu if c.dtype == "float32"} == {4, 8, 64}
    assert {c.W for c in gpu if c.shape == (32, 512, 1024)} == {4, 8}
    assert {c.shape for c in gpu} == {(8, 4096, 4096), (4, 2048, 16384), (32, 512, 1024),
                                      (1, 8192, 2048)}
    assert {c.W for c in gpu if c.shape == (8, 4096, 4096)} == set(mc.WIDTHS) | {24}
    # cells sharing inputs are adjacent: the (shape, dtype, layout) groups come in runs
    groups = [(c.shape, c.dtype, c.layout) for c in gpu]
    runs = [g for i, g in enumerate(groups) if i == 0 or g != groups[i - 1]]
    assert len(runs) == len(set(runs))
    assert len(mc.cells("cpu")) == (13 + 3) * 6 + 2 * 6


def test_matrix_filters():
    got = mc.cells("gpu", widths=[4, 64], layouts=["cl"], modes=["seq_idx"], dtypes=["float32"],
                   shapes=mc.parse_shapes("8x4096x4096", "gpu"))
    assert [(c.W, c.layout, c.mode, c.dtype) for c in got] == [(4, "cl", "seq_idx", "float32"),
                                                                (64, "cl", "seq_idx", "float32")]
    # a width the matrix lacks is still measured when asked for
    assert [c.W for c in mc.cells("gpu", widths=[48], layouts=["cf"], modes=["dense"], dtypes=["bfloat16"],
                                  shapes=mc.parse_shapes("8x4096x4096", "gpu"))] == [48]
    assert mc.parse_list("bf16,f32", "dtypes", mc.DTYPES) == ["bfloat16", "float32"]
    assert mc.parse_list("channels-last", "layouts", mc.LAYOUTS) == ["cl"]
    assert [s for s, _ in mc.parse_shapes("small", "gpu")] == [(32, 512, 1024), (1, 8192, 2048)]
    assert mc.parse_shapes("2x3x5", "cpu") == [((2, 3, 5), "big")]
    for bad in (lambda: mc.parse_list("bf8", "dtypes", mc.DTYPES),
                lambda: mc.parse_list("dense", "layouts", mc.LAYOUTS),
                lambda: mc.parse_widths("4,x"), lambda: mc.parse_widths("0"),
                lambda: mc.parse_shapes("8x4096", "gpu")):
        with pytest.raises(ValueError, match="--"):
            bad()


def test_floor_arithmetic():
    c = mc.Cell(8, 4096, 4096, "bfloat16", "cf", "dense", 4)
    N = 8 * 4096 * 4096
    params = (4096 * 4 + 4096) * 2
    assert mc.bytes_moved(c, "fwd") == 4 * N + params            # x read, y written
    assert mc.bytes_moved(c, "bwd") == 6 * N + 2 * params        # x, dy read; dx written
    assert mc.bytes_moved(c, "step") == 10 * N + 3 * params
    assert (mc.fmas(c, "fwd"), mc.fmas(c, "bwd"), mc.fmas(c, "step")) == (4 * N, 8 * N, 12 * N)
    s = mc.Cell(8, 4096, 4096, "float32", "cl", "seq_idx", 8)
    assert mc.bytes_moved(s, "fwd") == 8 * N + 8 * 4096 * 4 + (4096 * 8 + 4096) * 4
    st = mc.Cell(2, 16, 64, "float32", "cl", "states", 5)
    states = 2 * 16 * 4 * 4
    dense = dataclasses.replace(st, mode="dense")
    assert mc.bytes_moved(st, "fwd") - mc.bytes_moved(dense, "fwd") == 2 * states
    assert mc.bytes_moved(st, "bwd") - mc.bytes_moved(dense, "bwd") == 3 * states
    # the floor is the larger of the two
    bw, rate = 3e12, 25e12
    t, kind = mc.floor_s(c, "fwd", bw, rate)
    assert kind == "copy" and t == pytest.approx((4 * N + params) / bw)
    wide = mc.Cell(8, 4096, 4096, "bfloat16", "cf", "dense", 128)
    t, kind = mc.floor_s(wide, "step", bw, rate)
    assert kind == "fma" and t == pytest.approx(3 * N * 128 / rate)


def test_seq_idx_row():
    row = np.asarray(mc.seq_idx_row(1000))
    valid = row[row >= 0]
    assert (row[950:] == -1).all() and (row[:950] >= 0).all()
    assert sorted(set(valid.tolist())) == list(range(8))
    assert (np.diff(valid) >= 0).all()
    assert np.bincount(valid).min() >= 950 // 8 - 1


# ---- programs: what each pass runs --------------------------------------------

def _args(cell, pas):
    inputs = cm.Inputs(lambda c: 1)
    a, n = inputs.get(cell)
    return (a["xs"], a["w"], a["b"], a["seq"], a["inits"],
            None if pas == "fwd" else a["dys"], None if pas == "fwd" else a["dfins"]), n


@pytest.mark.parametrize("mode", ["dense", "seq_idx", "states"])
@pytest.mark.parametrize("layout", ["cf", "cl"])
def test_programs_call_the_kernels_they_time(mode, layout):
    cell = mc.Cell(2, 8, 64, "float32", layout, mode, 4)
    for impl in ("ours", "xla"):
        for pas in mc.PASSES:
            args, n = _args(cell, pas)
            text = cm.program(cm.pass_fn(impl, cell, pas), n).lower(*args).compile().as_text()
            cm.check_hlo(impl, pas, cm.hlo_census(text), n)


@pytest.mark.parametrize("cell", [
    mc.Cell(2, 64, 1024, "float32", "cf", "dense", 1),     # W = 1, float32: XLA, the whole op
    mc.Cell(2, 64, 1024, "bfloat16", "cf", "seq_idx", 2),  # small at W = 2: XLA, the whole op
    mc.Cell(4, 256, 4096, "bfloat16", "cf", "dense", 2),   # XLA for a forward alone only
    mc.Cell(2, 8, 64, "float32", "cl", "states", 4),       # the kernel
])
def test_auto_route_names_what_the_compiled_programs_call(cell):
    """The routing that the rendered matrix reports for backend="auto"
    (matrix_render.auto_route) is what a program with backend="auto"
    compiles to on this platform (the CPU; the GPU's rules below)."""
    routes = set()
    for pas in mc.PASSES:
        args, n = _args(cell, pas)
        census = cm.hlo_census(cm.program(cm.pass_fn("auto", cell, pas), n).lower(*args).compile().as_text())
        route = mr.auto_route(cell, pas, "cpu")
        routes.add(route)
        halves = route.replace(" forward", "").replace(" backward", "").split(", ")
        fwd_half, bwd_half = (halves * 2)[:2]
        want = {"fwd": (n * (route == "kernel"), 0), "bwd": (0, n * (route == "kernel")),
                "step": (n * (fwd_half == "kernel"), n * (bwd_half == "kernel"))}[pas]
        assert (census["forward"], census["backward"]) == want, (cell, pas, route)
    assert routes <= {"kernel", "XLA"}


def test_auto_route_reads_the_gpu_rules():
    dense4 = mc.Cell(1, 8192, 2048, "bfloat16", "cf", "dense", 4)
    assert [mr.auto_route(dense4, p, "gpu") for p in mc.PASSES] == ["XLA", "kernel", "kernel"]
    w1 = mc.Cell(8, 4096, 4096, "bfloat16", "cl", "states", 1)
    assert {mr.auto_route(w1, p, "gpu") for p in mc.PASSES} == {"XLA"}
    ids = mc.Cell(8, 4096, 4096, "float32", "cf", "seq_idx", 2)  # float32 W 2 seq_idx: XLA's forward alone
    assert [mr.auto_route(ids, p, "gpu") for p in mc.PASSES] == ["XLA", "kernel", "kernel"]
    assert {mr.auto_route(dataclasses.replace(ids, W=8), p, "gpu") for p in mc.PASSES} == {"kernel"}


def test_hlo_check_catches_a_step_that_dropped_the_forward():
    cell = mc.Cell(2, 8, 64, "float32", "cf", "dense", 4)
    args, n = _args(cell, "step")
    f = cm.conv_fn("ours", cell)

    def grad_of_loss(x, w, b, seq, init, dy, dfin):  # y's value unused: XLA drops the forward
        return jax.grad(lambda x, w, b: jnp.sum(f(x, w, b, seq, init) * dy), argnums=(0, 1, 2))(
            x, w, b)
    text = cm.program(grad_of_loss, n).lower(*args).compile().as_text()
    census = cm.hlo_census(text)
    assert census["forward"] == 0 and census["backward"] == 1
    with pytest.raises(AssertionError, match="lost its forward"):
        cm.check_hlo("ours", "step", census, n)
    with pytest.raises(AssertionError):
        cm.check_hlo("xla", "bwd", census, n)  # the baseline must not call our kernels


@pytest.mark.parametrize("mode", ["dense", "seq_idx", "states"])
def test_ours_and_xla_programs_compute_the_same(mode):
    cell = mc.Cell(2, 8, 48, "float32", "cl", mode, 3)
    for pas in mc.PASSES:
        args, n = _args(cell, pas)
        got = cm.program(cm.pass_fn("ours", cell, pas), n)(*args)
        want = cm.program(cm.pass_fn("xla", cell, pas), n)(*args)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5),
                     got, want)
    # and the forward against an independent formula (dense, channels-last)
    if mode == "dense":
        (xs, w, b, *_), _ = _args(cell, "fwd")
        x = np.asarray(xs[0], np.float64)
        xp = np.concatenate([np.zeros((2, 2, 8)), x], axis=1)
        pre = sum(xp[:, k:k + 48, :] * np.asarray(w)[:, k] for k in range(3)) + np.asarray(b)
        y = cm.program(cm.pass_fn("ours", cell, "fwd"), 1)(*_args(cell, "fwd")[0])[0]
        np.testing.assert_allclose(y, pre / (1 + np.exp(-pre)), rtol=1e-5, atol=1e-5)


def test_hlo_census_parses_instructions():
    text = """HloModule m
%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}
ENTRY %main (x: f32[4]) -> (f32[4], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %c = (f32[4]{0}, u8[8]{0}) custom-call(%x), custom_call_target="%s"
  %g = f32[4]{0} get-tuple-element(%c), index=0
  %f = f32[4]{0} fusion(%g), kind=kLoop, calls=%fused_computation
  %k = f32[4]{0} copy(%f)
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%f, %k)
}""".replace("%s", cm.targets.FORWARD)
    c = cm.hlo_census(text)
    assert c == dict(forward=1, backward=0, other={"fusion": 1, "copy": 1})


# ---- records, rendering, targets ------------------------------------------------

CAL = dict(copy_bytes_per_s=1e12, copy_wall_bytes_per_s=1e12, copy_bytes=1 << 30,
           time_source="device", fma_per_s=1e13, fma_wall_per_s=1e13, gemm="cuBLAS (SGEMM)",
           gemm_size=4096)
META = dict(platform="gpu", device="Test GPU", date="2026-11-24", jax="0", jax_causal_conv="0",
            commit="abc")


def _rec(cell, ours, xla, dev=True, meta=META):
    """ours / xla: {pass: us}; wall = the same + 5%."""
    def t(us):
        return {"wall_us": us * 1.05, **({"dev_us": us} if dev else {})}
    return dict(kind="conv_matrix", key=cell.key(), meta=dict(meta), calib=dict(CAL), n_calls=1,
                times={"ours": {p: t(v) for p, v in ours.items()},
                       "xla": {p: t(v) for p, v in xla.items()}},
                hlo={"ours/fwd": dict(forward=1, backward=0, other={})})


def _floor(cell, pas):
    return mc.floor_s(cell, pas, CAL["copy_bytes_per_s"], CAL["fma_per_s"])[0] * 1e6


def test_target_misses():
    good = mc.Cell(8, 4096, 4096, "bfloat16", "cf", "dense", 8)
    f = {p: _floor(good, p) for p in mc.PASSES}
    ok = _rec(good, {"fwd": f["fwd"] / 0.95, "bwd": f["bwd"] * 1.2, "step": f["step"] * 1.05},
              {p: v * 3 for p, v in f.items()})
    assert mr.target_misses([ok]) == []
    slow_fwd = _rec(good, {"fwd": f["fwd"] / 0.8, "step": f["step"] * 1.2},
                    {"fwd": f["fwd"], "step": f["step"] * 9})
    why = [w for _, w in mr.target_misses([slow_fwd])]
    assert any("fwd at 80% of its floor (target >= 90%)" in w for w in why)
    assert any("step at 1.20x its floor" in w for w in why)
    assert any("fwd slower than the XLA shifted sum" in w for w in why)
    seq = mc.Cell(8, 4096, 4096, "bfloat16", "cf", "seq_idx", 8)
    fs = {p: _floor(seq, p) for p in mc.PASSES}
    seq_slow = _rec(seq, {"fwd": f["fwd"] / 0.95 * 1.08, "step": f["step"] * 1.05},
                    {"fwd": fs["fwd"] * 5, "step": fs["step"] * 5})
    why = [w for _, w in mr.target_misses([ok, seq_slow])]
    assert any("seq_idx fwd 1.08x dense's time" in w for w in why)
    # the floor targets are graded by width; the states mode has none
    wide = mc.Cell(8, 4096, 4096, "bfloat16", "cl", "dense", 32)
    fw = _floor(wide, "fwd")
    assert mr.target_misses([_rec(wide, {"fwd": fw / 0.8}, {"fwd": fw * 2})]) == []
    st = mc.Cell(8, 4096, 4096, "bfloat16", "cl", "states", 4)
    assert mr.target_misses([_rec(st, {"fwd": _floor(st, "fwd") * 3}, {"fwd": 1e9})]) == []


def test_target_summary_counts_cells_and_names_the_misses():
    cells = [mc.Cell(8, 4096, 4096, "bfloat16", "cf", "dense", W) for W in (2, 3, 4, 8)]
    recs = []
    for c in cells:  # forwards at 95% of the floor but W 3 and 4 (80%)
        fl = _floor(c, "fwd")
        recs.append(_rec(c, {"fwd": fl / (0.8 if c.W in (3, 4) else 0.95)}, {"fwd": fl * 3}))
    rows = [r for r in mr.target_summary(recs) if r.startswith("| fwd at")]
    assert len(rows) == 1 and "| 2 of 4 |" in rows[0] and "W 3, 4 at (8,4096,4096) bf16" in rows[0]
    rows = [r for r in mr.target_summary(recs) if r.startswith("| fwd and step no slower")]
    assert len(rows) == 1 and "| 4 of 4 | — |" in rows[0]
    assert mr._widths({1, 2, 3, 5, 7, 8, 12, 16}) == "1..3, 5, 7, 8, 12, 16"
    # the summary and the list agree, cell by cell
    assert {(c.W, t) for c, t in mr.target_misses(recs)} == {
        (3, "fwd at 80% of its floor (target >= 90%)"), (4, "fwd at 80% of its floor (target >= 90%)")}


def test_render_gpu_and_cpu(tmp_path):
    cells = [mc.Cell(8, 4096, 4096, "bfloat16", lay, "dense", w) for lay in ("cf", "cl")
             for w in (1, 2, 4)]
    recs = [_rec(c, {p: _floor(c, p) * 1.02 for p in mc.PASSES},
                 {p: _floor(c, p) * 2 for p in mc.PASSES}) for c in cells]
    recs[0]["times"]["ours"]["fwd"]["dev_us"] *= 10      # one cell slower than XLA
    text = mr.render_group(recs)
    assert "#### (B, D, L) = (8, 4096, 4096), bfloat16" in text
    assert "fwd µs" in text and "nan" not in text
    assert "Cells where ours is slower than the XLA shifted sum (any pass, device or wall " \
           "time): 1." in text
    assert "bf16 cf dense W=1: fwd (device " in text
    assert "Cells missing issue 17's targets" in text
    assert "cuBLAS (SGEMM)" in text
    cpu_meta = dict(META, platform="cpu", device="cpu")
    cpu = [_rec(c, {p: _floor(c, p) * 1.02 for p in mc.PASSES},
                {p: _floor(c, p) * 2 for p in mc.PASSES}, dev=False, meta=cpu_meta)
           for c in cells]
    text = mr.render_group(cpu)
    assert "device time" not in text.split("####")[0].split("Times in")[1][:60]
    assert "issue 17's targets" not in text                  # GPU targets only
    assert "none." in text and "nan" not in text
    out = tmp_path / "b.md"
    out.write_text("# Benchmarks\n\nhand-written notes\n")
    pytest.importorskip("matplotlib")
    mr.publish(recs + cpu, str(out), log=lambda s: None)
    doc = out.read_text()
    assert "hand-written notes" in doc
    assert "<!-- gpu-matrix:start -->" in doc and "<!-- cpu-matrix:start -->" in doc
    assert (tmp_path / "benchmarks-gpu-width.png").stat().st_size > 1000
    assert "![time against width](benchmarks-gpu-width.png)" in doc


def test_json_store_merges(tmp_path):
    c1 = mc.Cell(1, 8, 64, "float32", "cf", "dense", 4)
    c2 = mc.Cell(1, 8, 64, "float32", "cf", "dense", 8)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    report.append_records(str(a), [_rec(c1, {"fwd": 1.0}, {"fwd": 2.0})])
    report.append_records(str(a), [_rec(c2, {"fwd": 1.0}, {"fwd": 2.0})])
    report.append_records(str(a), [_rec(c1, {"fwd": 3.0}, {"fwd": 2.0})])   # replaces c1
    recs = report.load_records([str(a)])
    assert len(recs) == 2
    assert {r["key"]["W"]: r["times"]["ours"]["fwd"]["dev_us"] for r in recs} == {4: 3.0, 8: 1.0}
    report.append_records(str(b), [_rec(c1, {"fwd": 5.0}, {"fwd": 2.0})])
    recs = report.load_records([str(a), str(b)])                            # later file wins
    assert {r["key"]["W"]: r["times"]["ours"]["fwd"]["dev_us"] for r in recs} == {4: 5.0, 8: 1.0}
    assert json.loads(a.read_text())["version"] == 1


def test_json_store_merges_passes(tmp_path):
    # a later run of some passes of a cell keeps the passes only the earlier
    # one timed, each floored with its own run's calibration
    c = mc.Cell(8, 4096, 4096, "bfloat16", "cf", "seq_idx", 12)
    old = _rec(c, {"fwd": 1.0, "bwd": 2.0, "step": 3.0}, {"fwd": 4.0, "bwd": 5.0, "step": 6.0})
    new = _rec(c, {"bwd": 7.0, "step": 8.0}, {"bwd": 9.0, "step": 10.0},
               meta=dict(META, commit="later"))
    new["calib"] = dict(CAL, copy_bytes_per_s=CAL["copy_bytes_per_s"] / 2)
    new["hlo"] = {"ours/bwd": dict(forward=0, backward=1, other={})}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    report.append_records(str(a), [old])
    report.append_records(str(b), [new])
    on_load = report.load_records([str(a), str(b)])
    report.append_records(str(a), [new])                  # the same merge when appended
    for recs in (on_load, report.load_records([str(a)])):
        (r,) = recs
        assert {p: t["dev_us"] for p, t in r["times"]["ours"].items()} == {"fwd": 1.0, "bwd": 7.0, "step": 8.0}
        assert {p: t["dev_us"] for p, t in r["times"]["xla"].items()} == {"fwd": 4.0, "bwd": 9.0, "step": 10.0}
        assert set(r["hlo"]) == {"ours/fwd", "ours/bwd"} and r["meta"]["commit"] == "later"
        assert set(r["pass_runs"]) == {"fwd"}
        assert mc.floor_us(r, "fwd")[0] == pytest.approx(_floor(c, "fwd"))       # the earlier run's rate
        assert mc.floor_us(r, "bwd")[0] == pytest.approx(2 * _floor(c, "bwd"))   # the later one's
    text = mr.render_group([r])
    assert "commit later" in text and f"commit {META['commit']}" in text        # both runs listed
    # merging again with a record of every pass drops the kept one
    full = _rec(c, {"fwd": 11.0, "bwd": 12.0, "step": 13.0}, {"fwd": 1.0, "bwd": 1.0, "step": 1.0})
    assert "pass_runs" not in report.merge_record(r, full)


def test_write_section(tmp_path):
    p = tmp_path / "sub" / "x.md"
    report.write_section(str(p), "cpu-decode", "first\n")
    report.write_section(str(p), "cpu-matrix", "matrix\n")
    report.write_section(str(p), "cpu-decode", "second\n")
    doc = p.read_text()
    assert doc.count("<!-- cpu-decode:start -->") == 1 and "second" in doc and "first" not in doc
    assert "matrix" in doc and doc.startswith("# Benchmarks")


@pytest.mark.on_cpu  # (its program must run on the CPU: on a GPU it has a device time)
def test_device_time_attribution():
    from benchmarks import timing
    events = [("a", 10, 20), ("b", 30, 40), ("c", 26, 49), ("d", 55, 60)]
    got, orphans = timing.attribute(events, {"0": (0, 25), "1": (25, 50)})
    assert [e[0] for e in got["0"]] == ["a"] and [e[0] for e in got["1"]] == ["b", "c"]
    assert orphans == 1                    # d lies in no window: the caller re-traces alone
    # a CPU trace has no GPU stream lines: no device times (the tables omit the column)
    f = jax.jit(lambda x: -x)
    x = jnp.ones((8,), jnp.float32)
    f(x).block_until_ready()
    assert timing.device_times({"neg": (f, (x,), 1)}, n=2) == {}


def test_progress_in_a_log_is_plain_lines():
    buf = io.StringIO()
    with Progress(2, "x", stream=buf) as p:
        p.step("one")
        p.log("a note")
        p.step("two")
    lines = buf.getvalue().splitlines()
    assert "\r" not in buf.getvalue()
    assert lines[0].startswith("[1/2 ") and lines[0].endswith("one")
    assert lines[1] == "a note" and lines[2].startswith("[2/2 ")


# ---- end to end on tiny shapes (structure only, no timing assertions) -----------

def test_matrix_runs_end_to_end(tmp_path):
    cells = mc.cells("cpu", widths=[2], modes=["dense", "states"], layouts=["cl"], dtypes=["bfloat16"],
                     shapes=mc.parse_shapes("1x8x64", "cpu"))
    path = tmp_path / "m.json"
    recs = cm.run("cpu", cells, json_path=str(path), log=lambda s: None)
    assert len(recs) == 2 and len(report.load_records([str(path)])) == 2
    for r in recs:
        assert set(r["times"]) == {"ours", "xla"}
        for impl in r["times"].values():
            assert set(impl) == set(mc.PASSES)
            assert all(t["wall_us"] > 0 and "dev_us" not in t for t in impl.values())
        assert r["hlo"]["ours/step"]["forward"] == 1 and r["hlo"]["ours/bwd"]["forward"] == 0
    text = mr.render_group(recs)
    assert "| cl | states | 2 |" in text


def test_decode_table_has_no_nan_or_empty_device_column():
    from benchmarks import decode_step as ds
    rows, notes = ds.bench_decode("cpu", sizes=[(2, 16)], layers=2, log=lambda s: None)
    assert {r["impl"] for r in rows} == {name for name, _ in ds.IMPLS}
    if ds.channels_last_problem("cpu"):
        assert len(rows) == 3 and "Channels-last state not measured" in notes[0]
    text = ds.markdown(report.run_meta("cpu"), rows, notes, None)
    assert "nan" not in text and "device" not in text.split("| decode step")[1].split("\n")[0]


def test_quick_bench_structure():
    from jax_causal_conv.cli import quick_bench
    res = quick_bench.measure("cpu", widths=(2,), shape=(1, 8, 64), dtype="float32")
    assert [(r["W"], r["impl"]) for r in res["rows"]] == [(2, i) for i in quick_bench.IMPLS]
    text = quick_bench.markdown(res)
    assert "| 2 | lax.conv |" in text and "nan" not in text
    # the three implementations compute the same function
    x = jax.random.normal(jax.random.key(0), (2, 8, 32), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (8, 5), jnp.float32)
    b = jax.random.normal(jax.random.key(2), (8,), jnp.float32)
    ref = jcc.reference.causal_conv1d(x, w, b, activation="silu")
    for name in quick_bench.IMPLS:
        np.testing.assert_allclose(quick_bench._impl(name)(x, w, b), ref, rtol=1e-5, atol=1e-5)


# ---- command lines ----------------------------------------------------------------

def _benchmark_modules():
    out = []
    for name in sorted(os.listdir(os.path.join(ROOT, "benchmarks"))):
        if name.endswith(".py"):
            with open(os.path.join(ROOT, "benchmarks", name)) as f:
                if "__main__" in f.read():
                    out.append(name[:-3])
    return out


@pytest.mark.parametrize("module", _benchmark_modules())
def test_every_benchmark_module_has_help(module, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(os.path.dirname(jcc.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", "--help"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage:")
    assert not list(tmp_path.iterdir())           # wrote nothing (not even a file named --help)


def test_conv_matrix_cli_refuses_bad_filters(capsys):
    assert cm.main(["--platform", "cpu", "--widths", "4,x"]) == 2
    assert "--widths" in capsys.readouterr().err
    assert cm.main(["--list", "--platform", "gpu", "--widths", "4", "--shapes", "small"]) == 0
    out = capsys.readouterr()
    assert out.out.count("\n") == 12 and "12 cells" in out.err


def test_suite_older_positional_form(monkeypatch):
    from benchmarks import bench
    seen = {}
    monkeypatch.setattr(bench, "run_suite", lambda args: seen.setdefault("a", args) and 0)
    bench.main(["cpu", "out.md"])
    a = seen["a"]
    # the form scripts use keeps its old scope (no 216-cell matrix) and file
    assert (a.platform, a.output, a.sections) == ("cpu", "out.md", "decode,baselines,torch")
    seen.clear()
    bench.main(["--platform", "cpu", "--sections", "matrix", "--widths", "4"])
    assert (seen["a"].sections, seen["a"].widths, seen["a"].output) == ("matrix", "4", None)


def test_a_failing_program_is_reported_and_the_cell_goes_on(monkeypatch):
    orig = cm.pass_fn

    def boom(x):
        raise RuntimeError("planted failure")

    def pass_fn(impl, cell, pas):
        single = orig(impl, cell, pas)
        if (impl, pas) != ("xla", "bwd"):
            return single

        def failing(*args):
            out = single(*args)
            return jax.pure_callback(boom, jax.ShapeDtypeStruct((), jnp.float32), out[0][0, 0, 0])
        return failing
    monkeypatch.setattr(cm, "pass_fn", pass_fn)
    cells = mc.cells("cpu", widths=[4], modes=["dense"], layouts=["cf"], dtypes=["float32"],
                     shapes=mc.parse_shapes("1x8x64", "cpu"))
    (rec,) = cm.run("cpu", cells, log=lambda s: None)
    assert "xla/bwd" in rec["errors"] and "bwd" not in rec["times"]["xla"]
    assert set(rec["times"]["ours"]) == set(mc.PASSES)
    text = mr.render_group([rec])
    assert "Programs that failed" in text and "xla/bwd" in text
    assert "| — |" in text


def test_matrix_compare_side_by_side(tmp_path, capsys):
    """benchmarks.matrix_compare (tools/param_sweep.sh's table): one row per
    cell and part, each file's device time in its column, XLA's from the
    first, a dash where a file lacks the cell."""
    from benchmarks import matrix_compare

    def rec(W, fwd, xla):
        return {"key": {"B": 8, "D": 64, "L": 128, "dtype": "bfloat16", "layout": "cf", "mode": "dense", "W": W},
                "times": {"ours": {"fwd": {"dev_us": fwd}}, "xla": {"fwd": {"dev_us": xla}}}}

    a, b = tmp_path / "base.json", tmp_path / "ch8.json"
    a.write_text(json.dumps({"version": 1, "records": [rec(4, 10.0, 30.0), rec(8, 20.0, 40.0)]}))
    b.write_text(json.dumps({"version": 1, "records": [rec(4, 9.5, 31.0)]}))
    assert matrix_compare.main([str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "| base | ch8 | XLA |" in lines[0]
    assert lines[2].endswith("| 4 | fwd | 10.0 | 9.5 | 30.0 |")
    assert lines[3].endswith("| 8 | fwd | 20.0 | — | 40.0 |")


def test_sources_digest_names_the_kernel_sources(tmp_path):
    """The reports' kernel-sources digest follows the contents and paths of
    cuda/ and csrc/ (a device copy's git HEAD can be stale) and nothing else."""
    for sub, name, text in (("cuda", "a.cu", "x"), ("csrc", "b.h", "y"), ("docs", "c.md", "z")):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / name).write_text(text)
    d0 = report.sources_digest(str(tmp_path))
    assert d0 == report.sources_digest(str(tmp_path)) and len(d0) == 8
    (tmp_path / "docs" / "c.md").write_text("changed")
    assert report.sources_digest(str(tmp_path)) == d0
    (tmp_path / "cuda" / "a.cu").write_text("x2")
    d1 = report.sources_digest(str(tmp_path))
    assert d1 != d0
    (tmp_path / "cuda" / "a.cu").rename(tmp_path / "cuda" / "a2.cu")
    assert report.sources_digest(str(tmp_path)) != d1


def test_ncu_source_lines_sums_each_source_line(tmp_path, capsys):
    """The Nsight Compute source page's CSV (cuda,sass view): a file's
    header rows, then each source line's row (its totals) followed by its
    SASS rows, which must not be counted again; a row of inline asm whose
    quotes split it is skipped."""
    from benchmarks.probes import ncu_source_lines as nsl
    head = '"Line No","Source","Address","Source","Warp Stall Sampling (All Samples)","x","y","Instructions Executed"\n'
    csv_text = ('"File Path","/w/cuda/a.cu"\n"Function Name","K"\n' + head +
                '"10","acc += w * x;","-","-","30","0","0","600"\n'
                '"","","0x1","FFMA R1, R2, R3, R1","30","0","0","600"\n'
                '"File Path","/w/cuda/b.cuh"\n"Function Name","K"\n' + head +
                '"7","return Bit(m, p);","-","-","10","0","0","200"\n'
                '"","","0x2","LOP3.LUT P0","10","0","0","200"\n'
                '"9","asm volatile(st.global [%0]"," {%1}","-","x","0","0","5"\n')
    path = tmp_path / "k.csv"
    path.write_text(csv_text)
    assert nsl.lines(str(path)) == {("a.cu", 10): (600, 30, "acc += w * x;"),
                                    ("b.cuh", 7): (200, 10, "return Bit(m, p);")}
    assert nsl.main([str(path), "5"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "800 warp instructions" in out[0]
    assert out[1].startswith("a.cu") and "75.0% ins" in out[1]


@pytest.mark.parametrize("mode", ["dense", "seq_idx", "states", "seq_idx_states"])
@pytest.mark.parametrize("W,L", [(1, 40), (4, 300), (17, 10), (17, 300)])
def test_twin_backward_probe_matches_autodiff(mode, W, L):
    """The written-out backward of the twin-memory probe equals the
    reference's autodiff in float64 (every output, states and padding
    included; L < W - 1 too), and its temporaries stay within a few
    copies of x (the autodiff's held one a tap: W of them, on jax 0.10.2's
    CPU backend; docs/performance-log.md, 2026-11-28)."""
    from benchmarks.probes import twin_backward_memory as tb
    a = tb.inputs(3, 5, L, W, jnp.float64, mode, seed=W + L)
    got, want = tb.written_backward(*a), tb.autodiff_backward(*a)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        assert (g is None) == (e is None)
        if e is not None:
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-12, atol=1e-12)
    if mode == "seq_idx" and L == 300:
        big = tb.inputs(1, 64, 2048, W, jnp.float32, mode)
        temp = tb.compiled(tb.written_backward, big).memory_analysis().temp_size_in_bytes
        assert temp <= 6 * 64 * 2048 * 4
