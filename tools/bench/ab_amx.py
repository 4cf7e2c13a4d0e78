#!/usr/bin/env python3
"""Interleaved A/B of the BF16 matmul kernel family on the embedded models, batch 1: for each
held-out prompt and repeat, runs every method with DSINFER_AMX=0 (AVX-512 vdpbf16ps kernel)
and DSINFER_AMX=1 (AMX tiles, where the CPU has them) back to back, keeps the best decode
time per (kernel, method, prompt), and prints decode tokens/s = tokens / summed best seconds.
Interleaving matters on a shared VM: rates drift by 2x over minutes, so runs minutes apart
compare the neighbours, not the kernels.

  python3 tools/bench/ab_amx.py [--sets code,python] [--limit 10] [--repeat 3] [--max-tokens 256]
Standard library only; uses build/dsinfer generate --json, 1 thread.
"""
import argparse
import json
import os
import subprocess

from spec_methods import EMB, METHODS, REPO  # noqa: E402 (the script's own folder is on sys.path)


def run(bin_, amx, prompt, flags, max_tokens):
    env = dict(os.environ, DSINFER_AMX=amx)
    r = subprocess.run([bin_, "generate", "--model-path", os.path.join(EMB, "target"), "--prompt", prompt,
                        "--max-tokens", str(max_tokens), "--threads", "1", "--json", *flags],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"dsinfer failed: {r.stderr.strip()[:400]}")
    d = json.loads(r.stdout.splitlines()[0])
    return d["usage"]["completion_tokens"] - 1, d["timings"]["decode_seconds"], d["ids"], d["spec"]["tau"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="code,python")
    ap.add_argument("--methods", default="none,dflash,dspark-fixed,dspark")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--dsinfer", default=os.path.join(REPO, "build", "dsinfer"))
    a = ap.parse_args()
    methods = a.methods.split(",")
    print("| set | method | kernel | τ | decode tok/s | × plain (same kernel) | × plain AVX-512 |")
    print("|---|---|---|---|---|---|---|")
    for s in a.sets.split(","):
        rows = [json.loads(l) for l in open(os.path.join(REPO, "models", "eval", f"heldout_{s}.jsonl"))][:a.limit]
        best, toks, taus = {}, {}, {}
        for pi, r in enumerate(rows):
            for _ in range(a.repeat):
                for amx in ("0", "1"):
                    for m in methods:
                        n, sec, ids, tau = run(a.dsinfer, amx, r["prompt"], METHODS[m], a.max_tokens)
                        k = (amx, m, pi)
                        best[k] = min(best.get(k, 1e9), sec)
                        toks[k] = n
                        taus[k] = tau
        rate = {}
        for amx in ("0", "1"):
            for m in methods:
                t = sum(toks[(amx, m, i)] for i in range(len(rows)))
                sec = sum(best[(amx, m, i)] for i in range(len(rows)))
                rate[(amx, m)] = t / sec
        for amx in ("0", "1"):
            for m in methods:
                tau = sum(taus[(amx, m, i)] for i in range(len(rows))) / len(rows)
                print(f"| {s} | {m} | {'amx' if amx == '1' else 'avx512bf16'} | {tau:.2f} | {rate[(amx, m)]:.0f} | "
                      f"{rate[(amx, m)] / rate[(amx, 'none')]:.2f} | {rate[(amx, m)] / rate[('0', 'none')]:.2f} |")


if __name__ == "__main__":
    main()
