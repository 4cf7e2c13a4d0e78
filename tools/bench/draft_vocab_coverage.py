#!/usr/bin/env python3
"""How much of the embedded target's greedy output a frequency-ranked draft vocabulary covers.

Why: a drafter pass of the embedded set is dominated by its LM head (8192 x 320 over the 8
block positions) and the Markov head's 8192-row product, so restricting the draft head to
the N most frequent tokens (as FR-Spec does) would cut the drafter's cost about in
proportion, at the price of every draft that needs a token outside the set. This measures
that price before anyone builds it: token frequencies come from the training prompts
(tools/train/prompts.npz, train split, 40960 x 96 ids), and coverage is the share of
greedy output tokens of the held-out prompts (models/eval/heldout_*.jsonl, 128 new tokens
each, plain decoding) that fall inside the top N, and inside the top N plus the ids the
sequence already holds (its prompt and the output so far): what dsinfer's reduced draft
vocabulary drafts from (spec/draft_vocab.h). Session 11 measured only the first and judged the
idea not worth building; the second is 99 % and more at N = 256 (docs/PERFORMANCE.md,
session 13). --ranking FILE takes the ranking from a draft_vocab.json instead.

Usage: python3 tools/bench/draft_vocab_coverage.py [--dsinfer build/dsinfer] [--tokens 128]
       [--sizes 256,1024,4096] [--ranking models/embedded/target/draft_vocab.json]
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
    j = json.loads(out.stdout.strip().splitlines()[-1])
    return j["prompt_ids"], j["ids"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsinfer", default=os.path.join(ROOT, "build/dsinfer"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/embedded/target"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--sizes", default="256,1024,2048,4096,6144")
    ap.add_argument("--ranking", help="a draft_vocab.json (default: frequencies of the training prompts)")
    args = ap.parse_args()
    if args.ranking:
        ranked = json.load(open(args.ranking))["ranked_ids"]
        print("ranking from %s" % args.ranking)
    else:
        freq = collections.Counter(train_ids())
        ranked = [t for t, _ in freq.most_common()]
        print("training prompt tokens %d, distinct ids %d" % (sum(freq.values()), len(ranked)))
    sizes = [int(s) for s in args.sizes.split(",")]
    for name in ("code", "python", "prose"):
        seqs = []
        with open(os.path.join(ROOT, "models/eval/heldout_%s.jsonl" % name)) as f:
            for line in f:
                seqs.append(greedy_ids(args.dsinfer, args.model, json.loads(line)["prompt"], args.tokens))
        total = sum(len(ids) for _, ids in seqs)
        cov = []
        for n in sizes:
            top = set(ranked[:n])
            alone = with_ctx = 0
            for prompt_ids, ids in seqs:
                seen = set(prompt_ids)
                for t in ids:
                    alone += t in top
                    with_ctx += t in top or t in seen
                    seen.add(t)
            cov.append("top %d: %.3f, + own ids: %.3f" % (n, alone / total, with_ctx / total))
        print("%-6s %d output tokens; %s" % (name, total, "; ".join(cov)))


if __name__ == "__main__":
    main()
