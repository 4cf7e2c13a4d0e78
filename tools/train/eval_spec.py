#!/usr/bin/env python3
"""Measures τ (mean accepted length per round incl. the bonus token, dsinfer's spec.tau) and
tokens/s of plain vs DFlash vs DSpark decoding on the held-out prompt sets, at batch 1 on this CPU.

  python3 tools/train/eval_spec.py [--dir models/embedded] [--sets code,python,prose] \
      [--max-tokens 256] [--limit 30] [--threads 1] [--temperature 0]
Prints one table and writes --out (default DIR/train-logs/eval_spec.json). Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def run(bin_, args):
    r = subprocess.run([bin_, "generate", *args, "--json"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"dsinfer failed: {r.stderr.strip()[:400]}")
    return json.loads(r.stdout.splitlines()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(REPO, "models", "embedded"))
    ap.add_argument("--sets", default="code,python,prose")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--limit", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--dsinfer", default=os.path.join(REPO, "build", "dsinfer"))
    ap.add_argument("--out")
    a = ap.parse_args()
    methods = [("none", None), ("dflash", "dflash"), ("dspark", "dspark")]
    res = {}
    for s in a.sets.split(","):
        rows = [json.loads(l) for l in open(os.path.join(REPO, "models", "eval", f"heldout_{s}.jsonl"))][:a.limit]
        for name, sub in methods:
            if sub and not os.path.isdir(os.path.join(a.dir, sub)):
                continue
            taus, tps, toks, secs = [], [], 0, 0.0
            for r in rows:
                args = ["--model-path", os.path.join(a.dir, "target"), "--prompt", r["prompt"],
                        "--max-tokens", str(a.max_tokens), "--threads", str(a.threads), "--ignore-eos",
                        "--temperature", str(a.temperature), "--seed", "1"]
                if sub:
                    args += ["--spec", name, "--draft-model-path", os.path.join(a.dir, sub)]
                j = run(a.dsinfer, args)
                taus.append(j["spec"]["tau"])
                toks += j["usage"]["completion_tokens"]
                secs += j["timings"]["decode_seconds"]
            res.setdefault(s, {})[name] = {"tau": statistics.mean(taus), "tokens_per_s": toks / max(secs, 1e-9),
                                           "prompts": len(rows)}
        base = res[s]["none"]["tokens_per_s"]
        for name in res[s]:
            res[s][name]["speedup"] = res[s][name]["tokens_per_s"] / base
            print(f"{s:8s} {name:7s} tau {res[s][name]['tau']:.3f}  {res[s][name]['tokens_per_s']:8.1f} tok/s  "
                  f"x{res[s][name]['speedup']:.2f}")
        if "dspark" in res[s] and "dflash" in res[s]:
            print(f"{s:8s} dspark/dflash tau ratio {res[s]['dspark']['tau'] / res[s]['dflash']['tau']:.3f}")
    out = a.out or os.path.join(a.dir, "train-logs", "eval_spec.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    json.dump({"args": vars(a), "results": res}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
