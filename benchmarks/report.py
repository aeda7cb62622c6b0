"""What the benchmarks share for reporting: run metadata, number formats,
markdown tables, and the JSON store of measured records (partial runs
merge: a record replaces the passes an earlier one with the same key
timed, and keeps the passes only the earlier one timed, each with its own
run's calibration and metadata)."""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys

from jax_causal_conv.cli.bench_options import add_arguments, resolve_platform
from jax_causal_conv.cli.bench_options import emit, write_section  # noqa: F401  (re-exported)


def sources_digest(root):
    """The first 8 hex digits of a SHA-1 over the kernel sources (cuda/,
    csrc/: paths and contents), which name the kernels measured even where
    the checkout's git HEAD is stale (a copied working tree)."""
    h = hashlib.sha1()
    for sub in ("cuda", "csrc"):
        for dirpath, dirnames, files in sorted(os.walk(os.path.join(root, sub))):
            dirnames.sort()
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:8]


def run_meta(platform):
    """Where and when: platform, device kind, date, versions, git commit
    ('-dirty' when the tree differs from it) and the kernel sources' digest."""
    import jax

    import jax_causal_conv as jcc
    dev = jax.devices(platform)[0]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=root,
                                text=True, capture_output=True, timeout=10).stdout.strip() or None
    except Exception:  # no git, not a checkout
        commit = None
    sources = sources_digest(root) if os.path.isdir(os.path.join(root, "cuda")) else None
    return dict(platform=platform, device=getattr(dev, "device_kind", platform),
                date=datetime.date.today().isoformat(), jax=jax.__version__,
                jax_causal_conv=jcc.__version__, commit=commit, sources=sources)


def heading(meta, what):
    commit = f", commit {meta['commit']}" if meta.get("commit") else ""
    commit += f" (kernel sources {meta['sources']})" if meta.get("sources") else ""
    return (f"### {what}: {meta['device']} ({meta['platform']}), {meta['date']}, "
            f"jax {meta['jax']}{commit}")


def fmt_us(us):
    """Microseconds with about 4 significant digits; '—' for a missing value."""
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return "—"
    if us >= 1000:
        return f"{us:,.0f}"
    if us >= 100:
        return f"{us:.1f}"
    return f"{us:.2f}"


def md_table(header, rows, right=None):
    """A markdown table; `right`: indices of right-aligned (numeric) columns."""
    right = set(range(1, len(header))) if right is None else set(right)
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def load_records(paths):
    """Records of the JSON files, later files and later records winning per
    key and pass (merge_record)."""
    merged = {}
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        _merge_into(merged, data.get("records", []))
    return list(merged.values())


def _merge_into(merged, records):
    """Adds records to {record_key: record}, merged with those of the same key."""
    for r in records:
        k = record_key(r)
        merged[k] = merge_record(merged[k], r) if k in merged else r


def record_key(r):
    return json.dumps([r.get("kind"), r["meta"]["platform"], r["meta"]["device"], r["key"]],
                      sort_keys=True)


def passes_of(r):
    return {p for impl in r.get("times", {}).values() for p in impl}


def merge_record(old, new):
    """new, with the passes that only old timed (a later run of some passes
    of a cell): each kept pass keeps its run's calibration and metadata in
    `pass_runs`, where the floors and the render read them
    (matrix_cells.pass_run)."""
    kept = passes_of(old) - passes_of(new)
    if not kept:
        return new
    r = json.loads(json.dumps(new))
    for impl, passes in old.get("times", {}).items():
        for p in kept & set(passes):
            r["times"].setdefault(impl, {})[p] = passes[p]
    for field in ("hlo", "errors"):  # (keyed "impl/pass")
        for name, v in old.get(field, {}).items():
            if name.split("/")[-1] in kept:
                r.setdefault(field, {})[name] = v
    runs = old.get("pass_runs", {})
    r.setdefault("pass_runs", {}).update(
        {p: runs.get(p, {"meta": old["meta"], "calib": old["calib"]}) for p in kept})
    return r


def append_records(path, records):
    """Adds records to the JSON file at `path` (created if absent), merged
    with those of the same key (merge_record); written atomically."""
    old = load_records([path]) if os.path.exists(path) else []
    merged = {record_key(r): r for r in old}
    _merge_into(merged, records)
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"version": 1, "records": list(merged.values())}, f, indent=1)
    os.replace(tmp, path)


# Rows of the baseline tables (baselines.py, bench_torch.py): one timed
# implementation of one shape, fwd and training step, beside a copy yardstick.

def add_row(rows, log, name, impl, measure, t_copy):
    """Times one implementation (measure() -> fwd and step seconds) and records
    it as a table row, logged; a baseline that does not run here is logged and
    left out."""
    try:
        t_fwd, t_step = measure()
    except Exception as e:  # a baseline that does not run here
        log(f"{name} {impl}: {type(e).__name__}: {e}")
        return
    rows.append(dict(shape=name, impl=impl, fwd_ms=t_fwd * 1e3, step_ms=t_step * 1e3,
                     copy_ms=t_copy * 1e3, frac=t_copy / t_fwd))
    log(f"{name:34s} {impl:22s} fwd {t_fwd*1e3:8.4f} ms  step {t_step*1e3:8.4f} ms  "
        f"copy {t_copy*1e3:8.4f} ms  ({t_copy / t_fwd:5.1%} of copy bw)")


def speed_section(meta, title, text, rows, ours_impl):
    """A baseline table's markdown: heading, what it measures, the table."""
    return "\n".join([heading(meta, title), "", text, ""] + speed_table(rows, ours_impl)) + "\n"


def speed_table(rows, ours_impl):
    """Markdown rows: times, the copy yardstick, and each row against ours."""
    header = ["shape (B,D,L) dtype", "impl", "fwd ms", "train step ms", "copy ms", "of copy bw",
              "ours faster"]
    ours = {r["shape"]: r for r in rows if r["impl"] == ours_impl}
    out = []
    for r in rows:
        o = ours.get(r["shape"])
        ratio = ("" if o is None or r is o else
                 f"{r['fwd_ms'] / o['fwd_ms']:.2f}x / {r['step_ms'] / o['step_ms']:.2f}x")
        out.append([r["shape"], r["impl"], f"{r['fwd_ms']:.4f}", f"{r['step_ms']:.4f}",
                    f"{r['copy_ms']:.4f}", f"{r['frac']:.1%}", ratio])
    return md_table(header, out, right=range(2, len(header)))


def section_main(name, doc, run, argv=None):
    """The command line of a one-section benchmark module
    (`python -m benchmarks.NAME [--platform P] [--output FILE]`): parses
    it, resolves the platform (exit 2 with the reason when it is not
    there) and calls run(platform, output)."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=doc.split("\n\n")[0])
    add_arguments(p, suite=False, matrix=False, plot=False)
    args = p.parse_args(argv)
    try:
        platform = resolve_platform(args.platform)
    except SystemExit as e:
        print(f"{name}: {e}", file=sys.stderr)
        return 2
    run(platform, args.output)
    return 0
