#!/usr/bin/env python3
"""Writes tools/train/corpus_manifest.json (helper of build_corpus.sh): the packages (version,
.deb sha256, licence summary from /usr/share/doc/<pkg>/copyright of the unpacked package),
per-split/domain file counts and bytes, and the sha256/size of the corpus archive."""
import argparse
import glob
import hashlib
import json
import os
import re


def file_sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


LICENCE_HINT = {
    "linux-source-6.12": "GPL-2.0-only WITH Linux-syscall-note (most files; individual files carry SPDX tags, "
                         "some dual-licensed BSD/MIT); Documentation: GPL-2.0 / CC-BY-4.0 per file",
    "gcc-12-source": "GPL-3.0-or-later WITH GCC-exception-3.1 (runtime libraries), GPL-3.0-or-later (compiler), "
                     "LGPL-2.1+ (libiberty), GFDL-1.3 (texinfo manuals)",
    "libpython3.11-stdlib": "PSF-2.0",
    "libpython3.11-minimal": "PSF-2.0",
    "libpython3.11-testsuite": "PSF-2.0",
    "python3.11-doc": "PSF-2.0 (documentation sources)",
}


def licences(copyright_path):
    if not os.path.isfile(copyright_path):
        return []
    txt = open(copyright_path, errors="replace").read()
    return sorted(set(m.strip() for m in re.findall(r"^License:\s*(.+)$", txt, re.M)))[:20]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--packages", nargs="+", required=True)
    a = ap.parse_args()
    pk = []
    for p in a.packages:
        debs = sorted(glob.glob(os.path.join(a.work, "debs", f"{p}_*.deb")))
        deb = debs[-1]
        ver = os.path.basename(deb).split("_")[1].replace("%3a", ":")
        cp = os.path.join(a.work, "pkgs", p, "usr/share/doc", p, "copyright")
        pk.append({"package": p, "version": ver, "deb": os.path.basename(deb), "deb_bytes": os.path.getsize(deb),
                   "deb_sha256": file_sha(deb), "licence": LICENCE_HINT.get(p, ""),
                   "copyright_licenses": licences(cp), "copyright_file": f"/usr/share/doc/{p}/copyright"})
    sel = json.load(open(os.path.join(a.work, "out", "select_stats.json")))
    arch = os.path.join(a.work, "out", "corpus.tar.xz")
    splits = {}
    for s in ("train", "heldout"):
        for f in sorted(glob.glob(os.path.join(a.work, "out", "corpus", s, "*.jsonl"))):
            splits.setdefault(s, {})[os.path.basename(f)] = {"bytes_jsonl": os.path.getsize(f), "sha256": file_sha(f)}
    raw_total = sum(d[s]["bytes"] for d in sel["domains"].values() for s in ("train", "heldout"))
    man = {
        "description": "dsinfer embedded-model corpus, built by tools/train/build_corpus.sh from Debian 12 packages",
        "debian": open("/etc/debian_version").read().strip(),
        "packages": pk,
        "selection": {k: sel[k] for k in ("caps_mb", "pkg_caps_mb", "heldout_permille", "min_bytes", "max_bytes")},
        "domains": sel["domains"],
        "raw_text_bytes_total": raw_total,
        "split_files": splits,
        "archive": {"name": "corpus.tar.xz", "bytes": os.path.getsize(arch), "sha256": file_sha(arch),
                    "repo_path": "train-data/corpus.tar.xz (git-ignored)"},
        "eval_prompts": {os.path.basename(f): sum(1 for _ in open(f))
                         for f in sorted(glob.glob(os.path.join(a.repo, "models", "eval", "heldout_*.jsonl")))},
    }
    out = os.path.join(a.repo, "tools", "train", "corpus_manifest.json")
    json.dump(man, open(out, "w"), indent=1)
    print(f"corpus_manifest: raw {raw_total/1e6:.1f} MB, archive {man['archive']['bytes']/1e6:.1f} MB -> {out}")


if __name__ == "__main__":
    main()
