#!/usr/bin/env python3
"""How much of the embedded target's greedy output a frequency-ranked draft vocabulary covers.

Why: a drafter pass of the embedded set is dominated by its LM head (8192 x 320 over the 8
block positions) and the Markov head's 8192-row product, so restricting the draft head to
the N most frequent tokens (as FR-Spec does) would cut the drafter's cost about in
proportion, at the price of every draft that needs a token outside the set. This measures
that price before anyone builds it: token frequencies come from the training prompts
(tools/train/prompts.npz, train split, 40960 x 96 ids), and coverage is the share of
greedy output tokens of the held-out prompts (models/eval/heldout_*.jsonl, 128 new tokens
each, plain decoding) that fall inside the top N.

Usage: python3 tools/bench/draft_vocab_coverage.py [--dsinfer build/dsinfer] [--tokens 128]
(standard library only; about a minute on one core).
"""
import argparse
import array
import collections
import json
import os
import struct
import subprocess
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train_ids():
    z = zipfile.ZipFile(os.path.join(ROOT, "tools/train/prompts.npz"))
    raw = z.read("train.npy")
    header_len = struct.unpack("<H", raw[8:10])[0]
    header = raw[10:10 + header_len].decode()
    if "'<u2'" not in header:
        raise SystemExit("tools/train/prompts.npz: train.npy is not uint16 ('descr' in %s)" % header.strip())
    ids = array.array("H")
    ids.frombytes(raw[10 + header_len:])
    return ids


def greedy_ids(dsinfer, model, prompt, tokens):
    out = subprocess.run([dsinfer, "generate", "--model-path", model, "--prompt", prompt, "--max-tokens", str(tokens),
                          "--spec", "none", "--threads", "1", "--temperature", "0", "--json"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ids"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsinfer", default=os.path.join(ROOT, "build/dsinfer"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/embedded/target"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--sizes", default="1024,2048,3072,4096,6144")
    args = ap.parse_args()
    freq = collections.Counter(train_ids())
    ranked = [t for t, _ in freq.most_common()]
    sizes = [int(s) for s in args.sizes.split(",")]
    print("training prompt tokens %d, distinct ids %d" % (sum(freq.values()), len(ranked)))
    for name in ("code", "python", "prose"):
        ids = []
        with open(os.path.join(ROOT, "models/eval/heldout_%s.jsonl" % name)) as f:
            for line in f:
                ids += greedy_ids(args.dsinfer, args.model, json.loads(line)["prompt"], args.tokens)
        cov = []
        for n in sizes:
            top = set(ranked[:n])
            cov.append("top %d: %.3f" % (n, sum(1 for t in ids if t in top) / len(ids)))
        print("%-6s %d output tokens; %s" % (name, len(ids), ", ".join(cov)))


if __name__ == "__main__":
    main()
