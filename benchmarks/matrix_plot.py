"""The conv matrix's plot: time against width, one panel per shape, dtype,
layout and mode; one colour per implementation (the floor in grey), the
forward solid and the training step dashed; the legend outside the data."""

from __future__ import annotations

from . import matrix_cells as mc
from .matrix_cells import floor_us, primary

COLOURS = {"ours": "tab:blue", "xla": "tab:orange", "floor": "0.55"}
STYLES = {"fwd": "-", "step": "--"}
MIN_WIDTHS = 3    # panels with fewer widths than this are left out


def panels(records):
    """{(B, D, L, dtype): {(layout, mode): [records sorted by W]}} for the
    shapes and dtypes measured at MIN_WIDTHS widths or more."""
    out = {}
    for r in records:
        k = r["key"]
        out.setdefault((k["B"], k["D"], k["L"], k["dtype"]), {}).setdefault(
            (k["layout"], k["mode"]), []).append(r)
    keep = {}
    for sk, by_lm in out.items():
        by_lm = {lm: sorted(rs, key=lambda r: r["key"]["W"]) for lm, rs in by_lm.items()
                 if len(rs) >= MIN_WIDTHS}
        if by_lm:
            keep[sk] = by_lm
    return keep


def plot_width(records, path, log=print):
    """Writes the plot to `path`; False (and a note) without matplotlib or
    without a shape measured at enough widths."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        log("no plot: matplotlib is not installed (pip install 'jax-causal-conv[bench]')")
        return False
    groups = panels(records)
    if not groups:
        log(f"no plot: no shape was measured at {MIN_WIDTHS} widths or more")
        return False
    cols = sorted({lm for g in groups.values() for lm in g},
                  key=lambda lm: (mc.LAYOUTS.index(lm[0]), mc.MODES.index(lm[1])))
    rows = sorted(groups, key=lambda k: (-k[0] * k[1] * k[2], k))
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(3.3 * len(cols), 2.8 * len(rows)),
                             squeeze=False, sharex=True)
    sources = set()
    for i, sk in enumerate(rows):
        for j, lm in enumerate(cols):
            ax = axes[i][j]
            rs = groups[sk].get(lm)
            if not rs:
                ax.set_visible(False)
                continue
            ws = [r["key"]["W"] for r in rs]
            for pas, ls in STYLES.items():
                for impl in ("ours", "xla"):
                    pts = [(w, primary(r["times"][impl][pas])) for w, r in zip(ws, rs)
                           if pas in r["times"].get(impl, {})]
                    if pts:
                        sources.update(s for _, (_, s) in pts)
                        ax.plot([w for w, _ in pts], [t for _, (t, _) in pts], ls,
                                color=COLOURS[impl], marker="o", markersize=3)
                ax.plot(ws, [floor_us(r, pas)[0] for r in rs], ls, color=COLOURS["floor"],
                        linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.25)
            B, D, L, dt = sk
            ax.set_title(f"({B},{D},{L}) {mc.short_dtype(dt)}\n{mc.LAYOUT_NAMES[lm[0]]}, {lm[1]}",
                         fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("µs per call", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("width W", fontsize=8)
    meta = records[0]["meta"]
    handles = [Line2D([], [], color=COLOURS[k], label=n)
               for k, n in (("ours", "ours"), ("xla", "XLA shifted sum"), ("floor", "floor"))]
    handles += [Line2D([], [], color="k", linestyle=ls, label=mc.PASS_NAMES[p])
                for p, ls in STYLES.items()]
    fig.legend(handles=handles, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(f"causal_conv1d, time against width: {meta['device']}, jax {meta['jax']}, "
                 f"{' / '.join(sorted(sources))} time, bias + SiLU", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    log(f"wrote {path}")
    return True
