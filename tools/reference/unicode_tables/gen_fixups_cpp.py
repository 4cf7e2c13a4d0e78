#!/usr/bin/env python3
"""Generate src/tokenizer/unicode_fixups.inc (the C++ table used by
src/tokenizer/regex_unicode.cpp) from fixups.json (written by diff_classes.py).

Each probe of fixups.json becomes one UniFixup row:
  \\p{X}        -> kind Prop,   key "X"
  \\s \\d \\w     -> kind Escape, key "s" / "d" / "w"
  [[:name:]]    -> kind Posix,  key "name"
  (?i:abc)      -> kind Fold,   key "abc" (only "add" is supported: code points that the
                   reference matches as a whole for the case-insensitive literal)
with its add / remove ranges and, when present, the reference's full range list.

Usage: gen_fixups_cpp.py FIXUPS.json OUT.inc
"""
import json
import os
import re
import sys


def classify(name):
    m = re.fullmatch(r"\\p\{([A-Za-z0-9_&]+)\}", name)
    if m:
        return "Prop", m.group(1)
    m = re.fullmatch(r"\\([sdw])", name)
    if m:
        return "Escape", m.group(1)
    m = re.fullmatch(r"\[\[:([a-z]+):\]\]", name)
    if m:
        return "Posix", m.group(1)
    m = re.fullmatch(r"\(\?i:([A-Za-z]+)\)", name)
    if m:
        return "Fold", m.group(1).lower()
    raise SystemExit("gen_fixups_cpp.py: probe %r has no C++ mapping; extend this script and "
                     "src/tokenizer/regex_unicode.cpp" % name)


def ranges_cpp(rs):
    items = ["{0x%X, 0x%X}" % (lo, hi) for lo, hi in rs]
    lines, cur = [], "   "
    for it in items:
        if len(cur) + len(it) + 2 > 100:
            lines.append(cur)
            cur = "   "
        cur += " " + it + ","
    lines.append(cur)
    return "\n".join(lines)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    doc = json.load(open(src))
    if doc.get("format") != "dsinfer-unicode-fixups-v1":
        sys.exit("%s: not a dsinfer-unicode-fixups-v1 file" % src)
    if doc.get("errors"):
        sys.exit("%s: probes valid on one engine only: %s" % (src, sorted(doc["errors"])))
    arrays, rows = [], []
    for i, (name, v) in enumerate(doc["probes"].items()):
        kind, key = classify(name)
        if kind == "Fold" and (v["remove"] or "full" in v):
            sys.exit("%s: %s: PCRE2 folds more than the reference; not supported" % (src, name))
        refs = []
        for field in ("add", "remove", "full"):
            rs = v.get(field) or []
            if rs:
                arr = "k%s%d" % (field.capitalize(), i)
                arrays.append("constexpr UniRange %s[] = {\n%s\n};" % (arr, ranges_cpp(rs)))
                refs.append("%s, %d" % (arr, len(rs)))
            else:
                refs.append("nullptr, 0")
        rows.append("    {UniKind::%s, %s, %s},  // %s +%d -%d" % (
            kind, json.dumps(key), ", ".join(refs), name,
            sum(h - l + 1 for l, h in v["add"]), sum(h - l + 1 for l, h in v["remove"])))
    rel = os.path.relpath(src, os.path.dirname(os.path.abspath(__file__)) + "/../../..")
    text = """// GENERATED FILE, do not edit. Made by tools/reference/unicode_tables/gen_fixups_cpp.py from
// %s
// (reference: %s; base: %s). Regenerate with (from the repo root)
//   python3 tools/reference/unicode_tables/gen_fixups_cpp.py
//       tools/reference/unicode_tables/fixups.json src/tokenizer/unicode_fixups.inc
// Included by src/tokenizer/regex_unicode.cpp, which defines UniRange, UniKind and UniFixup.
// Per probe: code points the reference adds to / removes from PCRE2's class, and (for a few
// small classes with removals) the reference's full range list. Ranges are inclusive.

%s

constexpr UniFixup kUniFixups[] = {
%s
};
""" % (rel, doc["reference"], doc["base"], "\n".join(arrays), "\n".join(rows))
    with open(out, "w") as f:
        f.write(text)
    print("wrote %s (%d probes, %d bytes)" % (out, len(rows), len(text)), file=sys.stderr)


if __name__ == "__main__":
    main()
