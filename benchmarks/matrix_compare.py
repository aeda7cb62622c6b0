"""Side by side: the device time of each cell and part in several
`benchmarks.conv_matrix --json` files (variants of one tree, or runs), with
XLA's time from the first. Used by tools/param_sweep.sh."""
import argparse
import json
import os
import sys


def cells(path):
    with open(path) as f:
        recs = json.load(f)["records"]
    out = {}
    for r in recs:
        k = r["key"]
        key = (f"{k['B']}x{k['D']}x{k['L']}", k["dtype"], k["layout"], k["mode"], k["W"])
        out[key] = r["times"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.matrix_compare", description=__doc__)
    ap.add_argument("json", nargs="+", help="conv_matrix --json files; the column names are their stems")
    paths = ap.parse_args(argv).json
    runs = [cells(p) for p in paths]
    names = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    print("| shape | dtype | layout | mode | W | part | " + " | ".join(names) + " | XLA |")
    print("|---|---|---|---|---:|---|" + "---:|" * (len(names) + 1))
    for key in sorted(runs[0], key=lambda k: (k[0], k[1], k[2], k[3], k[4])):
        for part in ("fwd", "bwd", "step"):
            if part not in runs[0][key]["ours"]:
                continue
            vals = [r.get(key, {}).get("ours", {}).get(part, {}).get("dev_us") for r in runs]
            xla = runs[0][key].get("xla", {}).get(part, {}).get("dev_us")
            fmt = lambda v: "—" if v is None else f"{v:.1f}"
            print(f"| {' | '.join(str(k) for k in key)} | {part} | " + " | ".join(fmt(v) for v in vals)
                  + f" | {fmt(xla)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
