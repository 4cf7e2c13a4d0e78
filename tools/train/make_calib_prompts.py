#!/usr/bin/env python3
"""Calibration prompts for `dsinfer calibrate` (STS of the DSpark confidence head), drawn from
the TRAIN split of the corpus, so that the held-out prompts in models/eval/heldout_*.jsonl stay
unseen by every fitted quantity (weights and temperatures alike).

  python3 tools/train/make_calib_prompts.py --corpus DIR/corpus [--per-domain 16] [--seed 11]
Writes models/eval/calib_mix.jsonl: per domain, files in sha256(text) order, one ~1.1 kB prompt
cut at line boundaries from each (the rule corpus_select.py uses for the held-out prompts).
Standard library only; deterministic.
"""
import argparse
import hashlib
import json
import os
import random

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True, help="unpacked corpus/ directory (train/*.jsonl)")
    ap.add_argument("--per-domain", type=int, default=16)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--scan", type=int, default=4000, help="files read per domain (first N lines)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rows = []
    for dom in ("code-c", "code-python", "prose"):
        docs = []
        with open(os.path.join(a.corpus, "train", f"{dom}.jsonl")) as f:
            for i, line in enumerate(f):
                if i >= a.scan:
                    break
                t = json.loads(line)["text"]
                docs.append((hashlib.sha256(t.encode()).hexdigest(), t))
        docs.sort()
        n = 0
        for _, t in docs:
            if n >= a.per_domain or len(t) < 1500:
                continue
            lines = t.split("\n")
            i = rng.randrange(0, max(1, len(lines) // 2))
            chunk = ""
            while i < len(lines) and len(chunk) < 1100:
                chunk += lines[i] + "\n"
                i += 1
            if 600 <= len(chunk) <= 2500:
                rows.append({"prompt": chunk, "domain": dom})
                n += 1
    out = os.path.join(REPO, "models", "eval", "calib_mix.jsonl")
    with open(out, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"make_calib_prompts: {len(rows)} prompts -> {out}")


if __name__ == "__main__":
    main()
