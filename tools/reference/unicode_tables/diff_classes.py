#!/usr/bin/env python3
"""Differences between two dumps of dump_reference_classes.py: REFERENCE (engine
"tokenizers") minus BASE (engine "pcre2", the system library dsinfer links).

For every probe present in both: "add" = code points the reference matches and PCRE2 does
not, "remove" = the opposite, both as inclusive [lo, hi] ranges. Prints a summary to stderr
and writes the compact JSON (only probes with a difference or an error on one side):
  {"format": "dsinfer-unicode-fixups-v1", "reference": engine_version, "base": ...,
   "probes": {"\\\\p{L}": {"add": [[lo, hi], ...], "remove": [...]}, ...},
   (a probe with a non-empty "remove" and at most FULL_MAX reference ranges also gets
    "full": the reference's complete range list, so that the C++ side can spell it out)
   "errors": {"name": {"reference": msg|null, "base": msg|null}}}

Usage: diff_classes.py REFERENCE.json BASE.json OUT.json
"""
import json
import sys

FULL_MAX = 64


def to_set_ops(a, b):
    """Inclusive sorted ranges a, b -> (a - b, b - a) as inclusive ranges."""
    events = []
    for lo, hi in a:
        events.append((lo, 0, +1))
        events.append((hi + 1, 0, -1))
    for lo, hi in b:
        events.append((lo, 1, +1))
        events.append((hi + 1, 1, -1))
    events.sort()
    cnt = [0, 0]
    only_a, only_b = [], []
    prev = None
    i = 0
    while i < len(events):
        x = events[i][0]
        if prev is not None and x > prev:
            state = (cnt[0] > 0, cnt[1] > 0)
            tgt = only_a if state == (True, False) else only_b if state == (False, True) else None
            if tgt is not None:
                if tgt and tgt[-1][1] + 1 == prev:
                    tgt[-1][1] = x - 1
                else:
                    tgt.append([prev, x - 1])
        while i < len(events) and events[i][0] == x:
            cnt[events[i][1]] += events[i][2]
            i += 1
        prev = x
    return only_a, only_b


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ref = json.load(open(sys.argv[1]))
    base = json.load(open(sys.argv[2]))
    bp = {p["name"]: p for p in base["probes"]}
    out = {"format": "dsinfer-unicode-fixups-v1", "reference": ref["engine_version"],
           "base": base["engine_version"], "probes": {}, "errors": {}}
    for p in ref["probes"]:
        q = bp.get(p["name"])
        if q is None:
            print("%-14s only in reference" % p["name"], file=sys.stderr)
            continue
        if "error" in p or "error" in q:
            if ("error" in p) != ("error" in q):
                out["errors"][p["name"]] = {"reference": p.get("error"), "base": q.get("error")}
            print("%-14s error: reference=%s base=%s" % (p["name"], p.get("error"), q.get("error")),
                  file=sys.stderr)
            continue
        add, rem = to_set_ops(p["ranges"], q["ranges"])
        n_add = sum(h - l + 1 for l, h in add)
        n_rem = sum(h - l + 1 for l, h in rem)
        print("%-14s +%d (%d ranges) -%d (%d ranges)" % (p["name"], n_add, len(add), n_rem, len(rem)),
              file=sys.stderr)
        if add or rem:
            out["probes"][p["name"]] = {"add": add, "remove": rem}
            if rem and len(p["ranges"]) <= FULL_MAX:
                out["probes"][p["name"]]["full"] = p["ranges"]
    with open(sys.argv[3], "w") as f:
        f.write(dumps(out))


def dumps(doc):
    """JSON with one line per probe field (range lists kept on one line): small diffs."""
    lines = ["{"]
    for k in ("format", "reference", "base"):
        lines.append(" %s: %s," % (json.dumps(k), json.dumps(doc[k])))
    lines.append(' "probes": {')
    names = list(doc["probes"])
    for i, name in enumerate(names):
        v = doc["probes"][name]
        fields = ["  %s: %s" % (json.dumps(k), json.dumps(v[k], separators=(",", ":"))) for k in v]
        lines.append("  %s: {\n%s\n  }%s" % (json.dumps(name), ",\n".join(" " + f for f in fields),
                                            "," if i + 1 < len(names) else ""))
    lines.append(" },")
    lines.append(' "errors": %s' % json.dumps(doc["errors"]))
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
