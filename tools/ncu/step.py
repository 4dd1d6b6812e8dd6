#!/usr/bin/env python3
"""Sum an `ncu --csv --print-units base` report per kernel name (scripts/h200-step.sh,
scripts/h200-decode.sh).

Prints, per kernel name (template arguments and launch parameters dropped): launches, total and
mean microseconds, share of the step, DRAM bytes read and written, and their rate over the
kernel's time; then the step's totals. Non-CSV lines (the program's own output) are skipped.
"""
import csv
import io
import re
import sys
from collections import defaultdict


def rows(path):
    with open(path, newline="", errors="replace") as f:
        text = [line for line in f if line.startswith('"')]
    return csv.DictReader(io.StringIO("".join(text)))


def main(path):
    kernels = defaultdict(dict)  # ID -> metric -> value
    names = {}
    for r in rows(path):
        try:
            i = int(r["ID"])
        except (KeyError, ValueError):
            continue
        names[i] = r.get("Kernel Name", "?")
        v = r.get("Metric Value", "").replace(",", "")
        try:
            kernels[i][r.get("Metric Name", "")] = float(v)
        except ValueError:
            kernels[i][r.get("Metric Name", "")] = v
    per = defaultdict(lambda: [0, 0.0, 0.0, 0.0, set()])
    for i, m in kernels.items():
        name = re.sub(r"\(.*$", "", re.sub(r"<.*>", "", names[i])).strip()
        p = per[name]
        p[0] += 1
        p[1] += m.get("gpu__time_duration.sum", 0.0) / 1e3
        p[2] += m.get("dram__bytes_read.sum", 0.0)
        p[3] += m.get("dram__bytes_write.sum", 0.0)
        p[4].add(str(m.get("launch__grid_size", "?")))
    total = sum(p[1] for p in per.values())
    print(f"{'kernel':60} {'n':>4} {'us':>9} {'us/each':>8} {'share':>6} {'MB read':>8} {'MB wr':>7} {'GB/s':>6}  grids")
    for name, (n, us, rd, wr, grids) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        rate = (rd + wr) / (us * 1e3) if us > 0 else 0.0
        g = ",".join(sorted(grids))[:40]
        print(f"{name[:60]:60} {n:4d} {us:9.1f} {us / n:8.2f} {100 * us / total:5.1f}% {rd / 1e6:8.1f} {wr / 1e6:7.1f} {rate:6.0f}  {g}")
    rd = sum(p[2] for p in per.values())
    wr = sum(p[3] for p in per.values())
    print(f"total: {sum(p[0] for p in per.values())} launches, {total / 1e3:.3f} ms, "
          f"{rd / 1e9:.2f} GB read, {wr / 1e9:.2f} GB written, {(rd + wr) / (total * 1e3):.0f} GB/s")


if __name__ == "__main__":
    main(sys.argv[1])
