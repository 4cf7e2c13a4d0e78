#!/usr/bin/env python3
"""Groups `ncu --csv --metrics gpu__time_duration.sum` rows by kernel (name with template
arguments) and grid: launches, mean and total microseconds, largest total first. For A/B
runs of kernel variants where ncu_summary.py's fixed layer layout does not apply.
Usage: ncu_kernels.py ncu.csv [top]"""
import collections
import csv
import re
import sys

tot = collections.Counter()
cnt = collections.Counter()
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "ns")
    us = v / 1e3 if unit in ("ns", "nsecond") else v * 1e3 if unit in ("ms", "msecond") else v if unit in ("us", "usecond") else v / 1e3
    name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("dsinfer::cuda::", "")
    name = re.sub(r"^void ", "", re.sub(r"\(.*", "", name)).strip()
    key = (name, r.get("Grid Size", ""))
    tot[key] += us
    cnt[key] += 1
top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
for key, us in tot.most_common(top):
    print("  %-64s grid %-14s x%5d  %8.2f us each  %10.1f us" % (key[0][:64], key[1], cnt[key], us / cnt[key], us))
