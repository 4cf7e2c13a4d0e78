#!/usr/bin/env python3
"""Dump, for every Unicode code point, membership in the regex property classes that
tokenizer Split patterns use, exactly as a regex engine sees them.

Why: dsinfer runs Split patterns on the system PCRE2 (Debian 12: 10.42, Unicode 14 tables),
while the reference (Hugging Face `tokenizers`, Rust) runs them on Oniguruma with newer
Unicode tables. Characters assigned after Unicode 14 (Kawi, new emoji, ...) fall in
different classes. This script measures the classes on both engines in one format so that
tools/reference/unicode_tables/diff_classes.py can list the code points where they differ.

Engines (--engine):
  tokenizers  the reference: tokenizers.pre_tokenizers.Split(tokenizers.Regex(P), ...),
              i.e. Oniguruma as built into the installed `tokenizers` wheel. Run on the
              machine that has tokenizers 0.23.2 (the version of the committed goldens).
  pcre2       the system libpcre2-8 through ctypes, compiled with UTF|UCP as
              src/tokenizer/regex.cpp does. Runs here (no pip packages needed).
Python's `unicodedata` is deliberately not used for the data (its Unicode version is the
Python build's, not the regex engine's); its version is only recorded as information.

Method, per probe (a class atom such as \\p{L}): the code points U+0000..U+10FFFF minus the
surrogates D800-DFFF are concatenated in order and cut into chunks of --chunk code points;
on each chunk the engine finds all matches of (?:ATOM)+ and their character offsets are
turned into inclusive code-point ranges (merged across chunks). Class membership does not
depend on context, so the union of the runs is exactly the set of code points the atom
matches. Checks, which abort the run on failure:
  - tokenizers: the matches (Split "removed", invert=True) and the gaps (Split "removed",
    invert=False) must tile each chunk exactly, and each piece's text must equal the
    chunk slice at its offsets (pre_tokenize_str reports character offsets);
  - every engine: --samples code points per probe (random, fixed seed, plus every range
    edge) are re-tested one by one as single-character strings against the plain atom.
"Single" probes (case-insensitive multi-letter literals such as (?i:ll)) are not repeated
with +; only matches of exactly one code point are kept as ranges.

Probes: every general category (one and two letters), \\s \\d \\w, a few scripts and POSIX
classes, (?i:x) for each ASCII letter, (?i:re|ve|ll) style multi-letter literals from the
contraction alternatives, plus every \\p{..}/\\P{..} name found in the Regex patterns of the
tokenizer.json files given with --tokenizer-json (default: tests/data/external/*/tokenizer.json
when present). A probe the engine rejects is recorded with "error" instead of ranges.

Output (one JSON file, --out, well under 1 MB):
  {"format": "dsinfer-unicode-classes-v1", "engine": ..., "engine_version": ...,
   "python": ..., "unicodedata_version": ..., "chunk": N, "samples": N,
   "code_points": 1112064, "tokenizer_json": {path: sha256},
   "probes": [{"name": "\\\\p{L}", "atom": "\\\\p{L}", "mode": "class"|"single",
               "ranges": [[lo, hi], ...] (inclusive), "count": N, "seconds": S,
               "multi_matches": [...] (single mode only)} | {..., "error": "..."}]}

Usage (from the repo root):
  python3 tools/reference/unicode_tables/dump_reference_classes.py --engine tokenizers \\
      --out OUT.json
  python3 tools/reference/unicode_tables/dump_reference_classes.py --engine pcre2 --out P.json
  python3 tools/reference/unicode_tables/dump_reference_classes.py --self-test
"""
import argparse
import ctypes
import ctypes.util
import glob
import hashlib
import json
import os
import platform
import random
import re
import sys
import time
import unicodedata

MAX_CP = 0x10FFFF
SURR_LO, SURR_HI = 0xD800, 0xDFFF
N_CODE_POINTS = MAX_CP + 1 - (SURR_HI - SURR_LO + 1)  # 1,112,064

GENERAL_CATEGORIES = [
    "L", "Lu", "Ll", "Lt", "Lm", "Lo",
    "M", "Mn", "Mc", "Me",
    "N", "Nd", "Nl", "No",
    "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po",
    "S", "Sm", "Sc", "Sk", "So",
    "Z", "Zs", "Zl", "Zp",
    "C", "Cc", "Cf", "Co", "Cn",
]
SCRIPTS = ["Han", "Hiragana", "Katakana", "Hangul", "Latin", "Greek", "Cyrillic", "Arabic",
           "Hebrew", "Thai", "Devanagari", "Common", "Inherited"]
# (name, atom, mode)
OTHER_PROBES = [
    (r"\s", r"\s", "class"),
    (r"\d", r"\d", "class"),
    (r"\w", r"\w", "class"),
    ("[[:alpha:]]", "[[:alpha:]]", "class"),
    ("[[:digit:]]", "[[:digit:]]", "class"),
    ("[[:punct:]]", "[[:punct:]]", "class"),
    ("[[:space:]]", "[[:space:]]", "class"),
    ("[[:upper:]]", "[[:upper:]]", "class"),
    ("[[:lower:]]", "[[:lower:]]", "class"),
]
# Multi-letter literals of the usual contraction alternative (?i:'s|'t|'re|'ve|'m|'ll|'d):
# a single code point could case-fold to two letters (as U+00DF folds to "ss").
MULTI_LITERALS = ["re", "ve", "ll", "ss", "st"]


def probe_list(extra_props):
    probes = []
    for gc in GENERAL_CATEGORIES:
        probes.append((r"\p{%s}" % gc, r"\p{%s}" % gc, "class"))
    for sc in SCRIPTS:
        probes.append((r"\p{%s}" % sc, r"\p{%s}" % sc, "class"))
    probes += OTHER_PROBES
    for c in "abcdefghijklmnopqrstuvwxyz":
        probes.append(("(?i:%s)" % c, "(?i:%s)" % c, "class"))
    for lit in MULTI_LITERALS:
        probes.append(("(?i:%s)" % lit, "(?i:%s)" % lit, "single"))
    have = {p[0] for p in probes}
    for name in sorted(extra_props):
        atom = r"\p{%s}" % name
        if atom not in have:
            probes.append((atom, atom, "class"))
            have.add(atom)
    return probes


PROP_RE = re.compile(r"\\[pP]\{\^?([A-Za-z0-9_ &=.-]+)\}|\\[pP]([A-Za-z])")


def props_in_pattern(pattern):
    """Property names used by \\p{X}, \\P{X}, \\p{^X}, \\pX in a regex source (escaped
    backslashes are skipped)."""
    out = set()
    i = 0
    while i < len(pattern):
        if pattern[i] == "\\":
            m = PROP_RE.match(pattern, i)
            if m:
                out.add(m.group(1) or m.group(2))
                i = m.end()
                continue
            i += 2
            continue
        i += 1
    return out


def regex_patterns(obj):
    """Every {"Regex": "..."} string anywhere inside a tokenizer.json object."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "Regex" and isinstance(v, str):
                yield v
            else:
                yield from regex_patterns(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from regex_patterns(v)


def all_code_points():
    return [c for c in range(MAX_CP + 1) if not (SURR_LO <= c <= SURR_HI)]


def chunks(cps, size):
    for i in range(0, len(cps), size):
        part = cps[i:i + size]
        yield part, "".join(map(chr, part))


def add_range(ranges, lo, hi):
    """Appends [lo, hi] to a sorted list of inclusive ranges, merging when adjacent."""
    if ranges and ranges[-1][1] + 1 >= lo:
        ranges[-1][1] = max(ranges[-1][1], hi)
    else:
        ranges.append([lo, hi])


def offsets_to_ranges(part, spans, ranges):
    """Char-offset spans [s, e) over the chunk whose code points are `part` -> ranges of
    code points. Spans need not be contiguous in code points (surrogate gap): split them."""
    for s, e in spans:
        j = s
        while j < e:
            k = j
            while k + 1 < e and part[k + 1] == part[k] + 1:
                k += 1
            add_range(ranges, part[j], part[k])
            j = k + 1


def in_ranges(ranges, c):
    lo, hi = 0, len(ranges)
    while lo < hi:
        mid = (lo + hi) // 2
        if ranges[mid][1] < c:
            lo = mid + 1
        else:
            hi = mid
    return lo < len(ranges) and ranges[lo][0] <= c <= ranges[lo][1]


# ---------------------------------------------------------------------------- engines

class TokenizersEngine:
    name = "tokenizers"

    def __init__(self):
        import tokenizers
        from tokenizers import Regex
        from tokenizers.pre_tokenizers import Split
        self.version = "tokenizers " + tokenizers.__version__
        self._Regex, self._Split = Regex, Split

    def compile(self, pattern):
        # Raises on an invalid pattern (tokenizers reports Oniguruma's error).
        matches = self._Split(self._Regex(pattern), "removed", invert=True)
        gaps = self._Split(self._Regex(pattern), "removed", invert=False)
        return (matches, gaps)

    def find_spans(self, compiled, text):
        matches, gaps = compiled
        m = matches.pre_tokenize_str(text)
        g = gaps.pre_tokenize_str(text)
        # Consistency: matches and gaps tile the text, offsets are character offsets.
        pieces = sorted([(o[0], o[1], s, True) for s, o in m] + [(o[0], o[1], s, False) for s, o in g])
        pos = 0
        for s, e, piece, _ in pieces:
            if s != pos or e <= s or text[s:e] != piece:
                raise RuntimeError("tokenizers Split pieces do not tile the text at offset %d "
                                   "(piece %r at %d..%d)" % (pos, piece[:20], s, e))
            pos = e
        if pos != len(text):
            raise RuntimeError("tokenizers Split pieces end at %d of %d" % (pos, len(text)))
        return [(s, e) for s, e, _, is_match in pieces if is_match]

    def matches_whole(self, compiled, ch):
        """Whether the one-character string `ch` is matched entirely."""
        matches, _ = compiled
        m = matches.pre_tokenize_str(ch)
        return len(m) == 1 and m[0][1] == (0, len(ch))


class Pcre2Engine:
    name = "pcre2"
    UTF, UCP, NO_UTF_CHECK, NOMATCH = 0x00080000, 0x00020000, 0x40000000, -1

    def __init__(self):
        path = ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0"
        lib = ctypes.CDLL(path)
        lib.pcre2_compile_8.restype = ctypes.c_void_p
        lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32,
                                        ctypes.POINTER(ctypes.c_int),
                                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
        lib.pcre2_match_data_create_from_pattern_8.restype = ctypes.c_void_p
        lib.pcre2_match_data_create_from_pattern_8.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.pcre2_match_8.restype = ctypes.c_int
        lib.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                      ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                                      ctypes.c_void_p]
        lib.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
        lib.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
        lib.pcre2_get_error_message_8.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
        self.lib = lib
        buf = ctypes.create_string_buffer(64)
        lib.pcre2_config_8(11, buf)  # PCRE2_CONFIG_VERSION
        ver = buf.value.decode()
        lib.pcre2_config_8(10, buf)  # PCRE2_CONFIG_UNICODE_VERSION
        self.version = "pcre2 %s (Unicode %s)" % (ver, buf.value.decode())

    def compile(self, pattern):
        b = pattern.encode("utf-8")
        err, off = ctypes.c_int(0), ctypes.c_size_t(0)
        code = self.lib.pcre2_compile_8(b, len(b), self.UTF | self.UCP, ctypes.byref(err),
                                        ctypes.byref(off), None)
        if not code:
            msg = ctypes.create_string_buffer(256)
            self.lib.pcre2_get_error_message_8(err.value, msg, 256)
            raise ValueError("pcre2: %s at offset %d" % (msg.value.decode(), off.value))
        md = self.lib.pcre2_match_data_create_from_pattern_8(code, None)
        return (code, md)

    def _find_bytes(self, compiled, b):
        code, md = compiled
        out, pos = [], 0
        while pos <= len(b):
            rc = self.lib.pcre2_match_8(code, b, len(b), pos, self.NO_UTF_CHECK, md, None)
            if rc == self.NOMATCH:
                break
            if rc < 0:
                raise RuntimeError("pcre2_match failed: %d" % rc)
            ov = self.lib.pcre2_get_ovector_pointer_8(md)
            s, e = ov[0], ov[1]
            if e > s:
                out.append((s, e))
                pos = e
            else:  # empty match: step one code point
                if s >= len(b):
                    break
                pos = s + 1
                while pos < len(b) and (b[pos] & 0xC0) == 0x80:
                    pos += 1
        return out

    def find_spans(self, compiled, text):
        b = text.encode("utf-8")
        char_at = {}
        bpos = 0
        for i, ch in enumerate(text):
            char_at[bpos] = i
            bpos += len(ch.encode("utf-8"))
        char_at[bpos] = len(text)
        return [(char_at[s], char_at[e]) for s, e in self._find_bytes(compiled, b)]

    def matches_whole(self, compiled, ch):
        b = ch.encode("utf-8")
        return self._find_bytes(compiled, b) == [(0, len(b))]


# ---------------------------------------------------------------------------- main loop

def run_probe(engine, cps, name, atom, mode, chunk, samples, rng):
    t0 = time.time()
    run_pattern = "(?:%s)+" % atom if mode == "class" else atom
    try:
        run_c = engine.compile(run_pattern)
        atom_c = engine.compile(atom)
    except Exception as e:  # invalid for this engine: record, do not abort
        return {"name": name, "atom": atom, "mode": mode, "error": str(e).splitlines()[0][:300]}
    ranges, multi = [], []
    for part, text in chunks(cps, chunk):
        spans = engine.find_spans(run_c, text)
        if mode == "single":
            for s, e in spans:
                if e - s == 1:
                    add_range(ranges, part[s], part[s])
                else:
                    multi.append(["U+%04X" % part[s], e - s])
        else:
            offsets_to_ranges(part, spans, ranges)
    # Independent spot check: single-character strings against the plain atom.
    check = set(rng.sample(cps, min(samples, len(cps))))
    for lo, hi in ranges[:5000]:
        for c in (lo - 1, lo, hi, hi + 1):
            if 0 <= c <= MAX_CP and not (SURR_LO <= c <= SURR_HI):
                check.add(c)
    for c in sorted(check):
        want = in_ranges(ranges, c)
        got = engine.matches_whole(atom_c, chr(c))
        if want != got:
            raise RuntimeError("%s: U+%04X is %s in the chunked scan but %s alone"
                               % (name, c, want, got))
    out = {"name": name, "atom": atom, "mode": mode, "ranges": ranges,
           "count": sum(hi - lo + 1 for lo, hi in ranges), "checked": len(check),
           "seconds": round(time.time() - t0, 2)}
    if mode == "single":
        out["multi_matches"] = multi[:100]
    return out


def make_engine(kind):
    return TokenizersEngine() if kind == "tokenizers" else Pcre2Engine()


def self_test():
    """Checks of the pure-Python parts (no engine needed)."""
    assert N_CODE_POINTS == 1112064
    assert props_in_pattern(r"[^\r\n\p{L}\p{N}]?\p{L}+|\P{Lu}\\p{X}\pM\p{^Han}") == \
        {"L", "N", "Lu", "M", "Han"}
    r = []
    for lo, hi in [(1, 2), (3, 5), (7, 7), (8, 9), (20, 30)]:
        add_range(r, lo, hi)
    assert r == [[1, 5], [7, 9], [20, 30]], r
    assert in_ranges(r, 1) and in_ranges(r, 5) and not in_ranges(r, 6) and in_ranges(r, 30)
    assert not in_ranges(r, 0) and not in_ranges(r, 31) and not in_ranges([], 3)
    part = [0xD7FE, 0xD7FF, 0xE000, 0xE001, 0xE005]
    rr = []
    offsets_to_ranges(part, [(0, 4), (4, 5)], rr)
    assert rr == [[0xD7FE, 0xD7FF], [0xE000, 0xE001], [0xE005, 0xE005]], rr
    cps = all_code_points()
    assert len(cps) == N_CODE_POINTS and cps[0xD800] == 0xE000
    tok = {"pre_tokenizer": {"pretokenizers": [{"pattern": {"Regex": r"\p{N}{1,3}"}},
                                              {"pattern": {"String": "x"}}]},
           "normalizer": {"pattern": {"Regex": r"\p{Zs}"}}}
    assert sorted(regex_patterns(tok)) == [r"\p{N}{1,3}", r"\p{Zs}"]
    print("self-test: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=["tokenizers", "pcre2"], default="tokenizers")
    ap.add_argument("--out", help="output JSON file")
    ap.add_argument("--tokenizer-json", nargs="*", default=None,
                    help="tokenizer.json files whose Regex patterns add \\p{..} probes "
                         "(default: tests/data/external/*/tokenizer.json)")
    ap.add_argument("--chunk", type=int, default=65536, help="code points per scanned string")
    ap.add_argument("--samples", type=int, default=3000,
                    help="random code points re-tested one by one per probe")
    ap.add_argument("--only", help="comma-separated probe names (debugging)")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        self_test()
        return
    if not args.out:
        ap.error("--out is required")

    tj = args.tokenizer_json
    if tj is None:
        tj = sorted(glob.glob("tests/data/external/*/tokenizer.json"))
    extra, tj_meta = set(), {}
    for path in tj:
        with open(path, "rb") as f:
            raw = f.read()
        tj_meta[path] = hashlib.sha256(raw).hexdigest()
        for pat in regex_patterns(json.loads(raw)):
            extra |= props_in_pattern(pat)

    engine = make_engine(args.engine)
    probes = probe_list(extra)
    if args.only:
        keep = set(args.only.split(","))
        probes = [p for p in probes if p[0] in keep]
    cps = all_code_points()
    rng = random.Random(12345)
    results = []
    t0 = time.time()
    for name, atom, mode in probes:
        res = run_probe(engine, cps, name, atom, mode, args.chunk, args.samples, rng)
        results.append(res)
        print("%-14s %s" % (name, ("error: " + res["error"]) if "error" in res else
                            "%d code points, %d ranges, %.1fs" % (res["count"], len(res["ranges"]),
                                                                  res["seconds"])),
              file=sys.stderr, flush=True)
    doc = {
        "format": "dsinfer-unicode-classes-v1",
        "engine": engine.name,
        "engine_version": engine.version,
        "python": platform.python_version(),
        "unicodedata_version": unicodedata.unidata_version,
        "chunk": args.chunk,
        "samples": args.samples,
        "code_points": len(cps),
        "tokenizer_json": tj_meta,
        "seconds": round(time.time() - t0, 1),
        "probes": results,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    os.replace(tmp, args.out)
    print("wrote %s (%d bytes, %d probes, %.0fs)" % (args.out, os.path.getsize(args.out),
                                                    len(results), time.time() - t0),
          file=sys.stderr)


if __name__ == "__main__":
    main()
