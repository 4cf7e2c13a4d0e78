#!/usr/bin/env python3
"""Summarises Nsight Compute's per-instruction warp-stall samples (`ncu -i REPORT --page source
--csv --print-source sass`, as scripts/cuda_device_run.sh's "stalls" step writes them): per
profiled launch, the kernel, its executed instructions, and the share of each stall reason;
with --top N, the N instructions with the most samples (address index, executions, samples,
SASS, main reasons), which is where a latency-bound kernel's time goes.
Usage: ncu_stalls.py SOURCE_CSV [--top N] [--launch K]"""
import collections
import csv
import sys


def launches(path):
    """Yields (kernel name, rows) for each profiled launch in the file."""
    name, lines = None, []
    with open(path) as f:
        for line in f:
            if line.startswith('"Kernel Name"'):
                if name is not None:
                    yield name, list(csv.DictReader(lines))
                name, lines = line.split('","')[1].strip().strip('",'), []
            else:
                lines.append(line)
    if name is not None:
        yield name, list(csv.DictReader(lines))


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    top = int(args[args.index("--top") + 1]) if "--top" in args else 0
    only = int(args[args.index("--launch") + 1]) if "--launch" in args else None
    for k, (name, rows) in enumerate(launches(args[0])):
        if only is not None and k != only:
            continue
        reasons = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
        total = collections.Counter()
        for r in rows:
            for c in reasons:
                total[c] += int(r[c] or 0)
        samples = sum(total.values()) or 1
        executed = sum(int(r["Instructions Executed"] or 0) for r in rows)
        print(f"launch {k}: {name[:100]}")
        print(f"  {len(rows)} instructions in the code, {sum(1 for r in rows if r['Instructions Executed'] not in ('', '0'))} executed, "
              f"{executed} warp-instructions, {samples} samples")
        print("  " + ", ".join(f"{c[6:]} {100 * v / samples:.1f} %" for c, v in total.most_common(8)))
        if top:
            ranked = sorted(range(len(rows)), key=lambda i: -int(rows[i]["Warp Stall Sampling (All Samples)"] or 0))[:top]
            for i in sorted(ranked):
                r = rows[i]
                main_reasons = sorted(((int(r[c] or 0), c[6:]) for c in reasons), reverse=True)[:2]
                print(f"  {i:5d} x{r['Instructions Executed']:>7} {r['Warp Stall Sampling (All Samples)']:>6}  "
                      f"{r['Source'].strip()[:56]:56s} {', '.join(f'{n} {v}' for v, n in main_reasons if v)}")


if __name__ == "__main__":
    main()
