"""Probe helper: where a kernel's instructions and stall samples go, by
source line, from Nsight Compute's source page (no GPU needed to read it).

On the GPU machine, a report with source counters, then one CSV a kernel
(the -k filter on import matches the function's base name, without
template arguments; --launch-skip picks among its launches):
    ncu -k regex:'Stream(Ids)?Kernel' --section SourceCounters --section InstructionStats \\
        --import-source yes -o /tmp/prof/prof python3 -m benchmarks.probes.ncu_probe seq 16
    ncu -i /tmp/prof/prof.ncu-rep -k regex:^BwdStreamIdsKernel --launch-count 1 \\
        --page source --csv --print-source cuda,sass > /tmp/prof/ids_bwd.csv
(only 8 files come back from a device call: tar them). Then anywhere:
    python3 -m benchmarks.probes.ncu_source_lines ids_bwd.csv [TOP] [--stalls]
prints each source line's share of the executed warp instructions and of
the stall samples, the largest first (inlined code counts at its own
header's line)."""
import csv
import sys


def lines(path):
    """{(file, line): (instructions executed, stall samples, source)}."""
    rows, file = {}, None
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "File Path":
                file = r[1].rsplit("/", 1)[-1]
            elif r[0].isdigit() and len(r) > 7:  # a source line's row (its SASS rows have no line number)
                try:
                    stalls = int(r[4]) if r[4] != "-" else 0
                    executed = int(r[7]) if r[7] != "-" else 0
                except ValueError:  # (a line of inline asm whose quotes split the row)
                    continue
                rows[(file, int(r[0]))] = (executed, stalls, r[1].strip())
    return rows


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    top = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 40
    by = 1 if "--stalls" in argv else 0
    rows = lines(argv[0])
    total = [max(1, sum(v[i] for v in rows.values())) for i in (0, 1)]
    print(f"{argv[0]}: {total[0]:,} warp instructions, {total[1]:,} stall samples")
    for (file, line), v in sorted(rows.items(), key=lambda kv: -kv[1][by])[:top]:
        print(f"{file:22s}{line:5d} {100 * v[0] / total[0]:5.1f}% ins {100 * v[1] / total[1]:5.1f}% stall  {v[2][:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
