#!/usr/bin/env python3
"""Summarises `ncu --csv --metrics gpu__time_duration.sum` over one forward of the CUDA
backend (scripts/cuda_device_run.sh, step ncu): the kernels in launch order, one line per
kernel kind of a layer (the GEMMs told apart by their place in the layer) with the total
over the layers, and the sum. With --by-kernel (step ncuab, A/B runs of kernel variants
where the fixed layer layout does not apply): launches grouped by kernel (name with template
arguments) and grid, largest total first.
Usage: ncu_summary.py ncu.csv [layers] | ncu_summary.py --by-kernel ncu.csv [top]"""
import collections
import csv
import re
import sys

by_kernel = len(sys.argv) > 1 and sys.argv[1] == "--by-kernel"
args = sys.argv[2:] if by_kernel else sys.argv[1:]
rows = []
with open(args[0]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1e3 if unit in ("ns", "nsecond") else v * 1e3 if unit in ("ms", "msecond") else v if unit in ("us", "usecond") else v / 1e3
    name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("<unnamed>::", "").replace("unnamed>::", "").replace("dsinfer::cuda::", "")
    if by_kernel:
        name = re.sub(r"^void ", "", re.sub(r"\(.*", "", name)).strip()  # keeps template arguments
    else:
        name = re.sub(r"\(.*", "", name).strip()
        name = re.sub(r"^void ", "", name)
    rows.append((name, r.get("Grid Size", ""), us))

if by_kernel:
    tot, cnt = collections.Counter(), collections.Counter()
    for name, grid, us in rows:
        tot[(name, grid)] += us
        cnt[(name, grid)] += 1
    top = int(args[1]) if len(args) > 1 else 20
    for key, us in tot.most_common(top):
        print("  %-64s grid %-14s x%5d  %8.2f us each  %10.1f us" % (key[0][:64], key[1], cnt[key], us / cnt[key], us))
    sys.exit(0)

layers = int(args[1]) if len(args) > 1 else 36
print(f"{len(rows)} kernels, {sum(r[2] for r in rows):.1f} us in all")
head = rows[:2]
per_layer = 6
body = rows[2:2 + layers * per_layer]
tail = rows[2 + layers * per_layer:]
for n, g, us in head:
    print(f"  {n[:60]:60s} grid {g:>16s} {us:9.1f} us")
labels = ["gemm qkv (+rmsnorm)", "qk norm + rope + kv", "attention", "gemm o (+= x)", "gemm gate|up (+rmsnorm, swiglu)", "gemm down (+= x)"]
for i, lab in enumerate(labels):
    ks = body[i::per_layer]
    if not ks:
        continue
    tot = sum(k[2] for k in ks)
    print(f"  {lab:40s} {ks[0][0][:28]:28s} grid {ks[0][1]:>16s} x{len(ks):3d} {tot:9.1f} us ({tot / len(ks):6.2f} each)")
for n, g, us in tail:
    print(f"  {n[:60]:60s} grid {g:>16s} {us:9.1f} us")
