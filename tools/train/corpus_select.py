#!/usr/bin/env python3
"""Selects, filters, dedupes and splits the training corpus (helper of build_corpus.sh).

Input: the package trees that build_corpus.sh unpacked under WORK (see there). Output, under
WORK/out/:
  corpus/{train,heldout}/{code-c,code-python,prose}.jsonl   one {"text","src"} object per file
  corpus.tar.xz                                            the corpus/ folder, for the GPU machine
and, in the repository: tools/train/corpus_manifest.json and models/eval/heldout_*.jsonl.

Everything is deterministic for given package versions: candidate files are ordered by
sha256(source-relative path) (a fixed pseudo-random order), kept while the domain's byte cap
allows, deduplicated by the sha256 of the whitespace-collapsed text, and a file is held out
when int(sha256(text)[:8], 16) % 1000 < HELDOUT_PERMILLE (per domain, ~2%).
Standard library only (runs with any python3).
"""
import argparse
import hashlib
import json
import os
import random
import re
import sys

HELDOUT_PERMILLE = 20
MIN_BYTES, MAX_BYTES = 256, 200_000


def sha(b):
    return hashlib.sha256(b).hexdigest()


def read_text(path):
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    if not (MIN_BYTES <= len(raw) <= MAX_BYTES) or b"\x00" in raw:
        return None
    try:
        t = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    t = t.replace("\r\n", "\n")
    lines = t.split("\n")
    if max(len(l) for l in lines) > 1000:
        return None  # minified / generated / tables
    if sum(len(l) > 200 for l in lines) > 0.05 * len(lines):
        return None
    return t if t.endswith("\n") else t + "\n"


HEX = re.compile(r"0x[0-9a-fA-F]+")


def code_ok(t):
    """Drops generated register headers, firmware blobs as C arrays, huge #define tables."""
    lines = [l for l in t.split("\n") if l.strip()]
    if not lines:
        return False
    if len(HEX.findall(t)) > 0.5 * len(lines) and len(t) > 8000:
        return False
    if sum(l.startswith("#define") for l in lines) > 0.6 * len(lines) and len(t) > 8000:
        return False
    return True


def prose_ok(t):
    return sum(c.isalpha() for c in t) > 0.45 * len(t)  # drops tables / ASCII art / data dumps


# (domain, package key, root relative to WORK, include regex on the relative path, exclude regex)
LINUX_EXCL = (r"(^|/)(Documentation/translations|drivers/gpu/drm/amd/include|firmware|"
              r"tools/testing/selftests/.*/generated|arch/[^/]+/boot)/|_reg\.h$|_sh_mask\.h$|_offset\.h$")


def sources(work):
    lx = "src/linux-source-6.12"
    gcc = "src/gcc-12.2.0"
    py = "pkgs"
    return [
        ("code-c", "linux-source-6.12", lx, r"\.(c|h)$", LINUX_EXCL + r"|^Documentation/"),
        ("code-c", "gcc-12-source", gcc,
         r"^(gcc/[^/]+\.(cc|h)|gcc/(c|c-family|cp)/[^/]+\.(cc|h)|libiberty/[^/]+\.[ch]|libcpp/[^/]+\.(cc|h)"
         r"|libgcc/[^/]+\.[ch]|libgomp/[^/]+\.[ch]|libbacktrace/[^/]+\.[ch]|gcc/testsuite/gcc\.(dg|c-torture)/.*\.c)$",
         r"^gcc/config/|insn-|gimple-match|generic-match"),
        ("code-python", "libpython3.11-stdlib", py + "/libpython3.11-stdlib/usr/lib/python3.11", r"\.py$",
         r"(^|/)(site-packages|dist-packages)/"),
        ("code-python", "libpython3.11-minimal", py + "/libpython3.11-minimal/usr/lib/python3.11", r"\.py$", r"$^"),
        ("code-python", "libpython3.11-testsuite", py + "/libpython3.11-testsuite/usr/lib/python3.11", r"\.py$",
         r"(^|/)(bad|badsyntax|tokenizedata)[^/]*\.py$"),
        ("prose", "linux-source-6.12", lx + "/Documentation", r"\.(rst|txt)$", LINUX_EXCL + r"|^translations/|^ABI/"),
        ("prose", "python3.11-doc", py + "/python3.11-doc/usr/share/doc/python3.11/html/_sources", r"\.rst\.txt$",
         r"^whatsnew/changelog"),
        ("prose", "gcc-12-source", gcc, r"^gcc/doc/[^/]+\.texi$", r"$^"),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/work/corpus")
    ap.add_argument("--repo", default=os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..")))
    ap.add_argument("--caps-mb", default="code-c=120,code-python=40,prose=45",
                    help="raw byte cap per domain (MB, 1e6)")
    ap.add_argument("--pkg-caps-mb", default="gcc-12-source=25", help="per-package cap within a domain")
    ap.add_argument("--prompts-per-domain", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    caps = {k: float(v) * 1e6 for k, v in (x.split("=") for x in a.caps_mb.split(","))}
    pkg_caps = {k: float(v) * 1e6 for k, v in (x.split("=") for x in a.pkg_caps_mb.split(","))}
    out = os.path.join(a.work, "out", "corpus")
    for s in ("train", "heldout"):
        os.makedirs(os.path.join(out, s), exist_ok=True)

    # Candidates per domain, in the fixed hash order, round-robin across that domain's sources
    # so a cap does not starve the later packages.
    by_domain = {}
    for dom, pkg, root, inc, exc in sources(a.work):
        absroot = os.path.join(a.work, root)
        if not os.path.isdir(absroot):
            sys.exit(f"corpus_select: missing {absroot} (run build_corpus.sh)")
        inc_re, exc_re = re.compile(inc), re.compile(exc)
        cands = []
        for dp, dns, fns in os.walk(absroot):
            dns.sort()
            for fn in sorted(fns):
                p = os.path.join(dp, fn)
                rel = os.path.relpath(p, absroot)
                if inc_re.search(rel) and not exc_re.search(rel) and os.path.isfile(p) and not os.path.islink(p):
                    cands.append((sha(f"{pkg}/{rel}".encode()), pkg, rel, p))
        cands.sort()
        by_domain.setdefault(dom, []).append(cands)
        print(f"corpus_select: {dom:12s} {pkg:26s} {len(cands):7d} candidate files", flush=True)

    seen = set()
    stats = {}
    heldout_docs = {}
    files = {(s, d): open(os.path.join(out, s, f"{d}.jsonl"), "w") for s in ("train", "heldout") for d in by_domain}
    for dom, lists in by_domain.items():
        cap, total, pkg_bytes = caps.get(dom, 1e18), 0, {}
        iters = [iter(c) for c in lists]
        st = stats.setdefault(dom, {"train": {"files": 0, "bytes": 0}, "heldout": {"files": 0, "bytes": 0},
                                    "rejected": 0, "duplicates": 0, "by_package": {}})
        while iters and total < cap:
            nxt = []
            for it in iters:
                item = next(it, None)
                if item is None:
                    continue
                nxt.append(it)
                _, pkg, rel, p = item
                if pkg_bytes.get(pkg, 0) >= pkg_caps.get(pkg, 1e18):
                    continue
                t = read_text(p)
                if t is None or not (prose_ok(t) if dom == "prose" else code_ok(t)):
                    st["rejected"] += 1
                    continue
                key = sha(" ".join(t.split()).encode())
                if key in seen:
                    st["duplicates"] += 1
                    continue
                seen.add(key)
                split = "heldout" if int(sha(t.encode())[:8], 16) % 1000 < HELDOUT_PERMILLE else "train"
                n = len(t.encode())
                files[(split, dom)].write(json.dumps({"text": t, "src": f"{pkg}/{rel}"}, ensure_ascii=False) + "\n")
                st[split]["files"] += 1
                st[split]["bytes"] += n
                bp = st["by_package"].setdefault(pkg, {"files": 0, "bytes": 0})
                bp["files"] += 1
                bp["bytes"] += n
                total += n
                pkg_bytes[pkg] = pkg_bytes.get(pkg, 0) + n
                if split == "heldout":
                    heldout_docs.setdefault(dom, []).append((f"{pkg}/{rel}", t))
            iters = nxt
        print(f"corpus_select: {dom}: {json.dumps(st)}", flush=True)
    for f in files.values():
        f.close()

    # Held-out evaluation prompts: ~1.1 kB (a few hundred tokens) cut at line boundaries from
    # held-out files, one prompt per file, files in hash order.
    rng = random.Random(a.seed)
    names = {"code-c": "code", "code-python": "python", "prose": "prose"}
    os.makedirs(os.path.join(a.repo, "models", "eval"), exist_ok=True)
    for dom, docs in heldout_docs.items():
        docs.sort(key=lambda x: sha(x[0].encode()))
        rows = []
        for src, t in docs:
            if len(rows) >= a.prompts_per_domain or len(t) < 1500:
                continue
            lines = t.split("\n")
            start = rng.randrange(0, max(1, len(lines) // 2))
            chunk, i = "", start
            while i < len(lines) and len(chunk) < 1100:
                chunk += lines[i] + "\n"
                i += 1
            if len(chunk) < 600 or len(chunk) > 2500:
                continue
            rows.append({"prompt": chunk, "domain": dom, "src": src})
        with open(os.path.join(a.repo, "models", "eval", f"heldout_{names[dom]}.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"corpus_select: {len(rows)} eval prompts for {dom}")
    with open(os.path.join(a.work, "out", "select_stats.json"), "w") as f:
        json.dump({"caps_mb": a.caps_mb, "pkg_caps_mb": a.pkg_caps_mb, "heldout_permille": HELDOUT_PERMILLE,
                   "min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES, "domains": stats}, f, indent=1)


if __name__ == "__main__":
    main()
