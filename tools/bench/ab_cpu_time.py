#!/usr/bin/env python3
"""Interleaved A/B of two dsinfer binaries at batch 1 in CPU time, for a host so loaded that
wall-clock tok/s moves several-fold between identical runs. For each held-out prompt, method
and repeat it runs `generate --json` with --max-tokens 1 and --max-tokens N on binary A, then
on binary B (each with its own XDG_CACHE_HOME, so each profiles its own SPS curve once,
before the timed runs), and takes decode CPU = CPU(user + sys) of the N-token run minus that
of the 1-token run (load, prefill, first token), best of --repeat. Prints decoded tokens per
CPU-second and mean τ per (set, method, binary). The generate flags are those of
tools/train/eval_spec.py (greedy, --ignore-eos, 1 thread).

  python3 tools/bench/ab_cpu_time.py --a OLD/dsinfer --b NEW/dsinfer [--sets code,python,prose] \\
      [--methods none,dspark-fixed,dspark] [--limit 10] [--repeat 2] [--max-tokens 256]
Standard library only.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile

from spec_methods import EMB, METHODS, REPO  # noqa: E402 (the script's own folder is on sys.path)


def cpu_run(binary, args, cache_dir):
    """CPU seconds of one `generate --json` run and its parsed output."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([binary, "generate", *args, "--json"], capture_output=True, text=True,
                       env=dict(os.environ, XDG_CACHE_HOME=cache_dir))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{binary} failed: {p.stderr.strip()[:400]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, json.loads(p.stdout.splitlines()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, help="binary A (e.g. the base commit's build/dsinfer)")
    ap.add_argument("--b", required=True, help="binary B")
    ap.add_argument("--sets", default="code,python,prose")
    ap.add_argument("--methods", default="none,dspark-fixed,dspark")
    ap.add_argument("--limit", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    a = ap.parse_args()
    bins = {"A": a.a, "B": a.b}
    tmp = tempfile.mkdtemp(prefix="ab_cpu_time.")
    caches = {k: os.path.join(tmp, k) for k in bins}
    target = ["--model-path", os.path.join(EMB, "target")]
    for k, b in bins.items():  # the SPS profile, into each binary's cache, untimed
        cpu_run(b, target + ["--prompt", "int main", "--max-tokens", "4", "--threads", "1", *METHODS["dspark"]], caches[k])
    print("| set | method | binary | decoded tokens per CPU-second | τ |\n|---|---|---|---|---|")
    for s in a.sets.split(","):
        rows = [json.loads(l) for l in open(os.path.join(REPO, "models", "eval", f"heldout_{s}.jsonl"))][:a.limit]
        for m in a.methods.split(","):
            tot = {k: [0.0, 0, []] for k in bins}  # decode CPU s, tokens, per-prompt τ
            for r in rows:
                args = target + ["--prompt", r["prompt"], "--threads", "1", "--ignore-eos", "--temperature", "0",
                                 "--seed", "1", *METHODS[m]]
                best = {k: [float("inf"), float("inf"), None] for k in bins}
                for _ in range(a.repeat):
                    for k, b in bins.items():
                        c1, _ = cpu_run(b, args + ["--max-tokens", "1"], caches[k])
                        cn, j = cpu_run(b, args + ["--max-tokens", str(a.max_tokens)], caches[k])
                        best[k] = [min(best[k][0], c1), min(best[k][1], cn), j]
                for k in bins:
                    j = best[k][2]
                    tot[k][0] += max(best[k][1] - best[k][0], 1e-6)
                    tot[k][1] += j["usage"]["completion_tokens"] - 1
                    tot[k][2].append(j["spec"]["tau"])
            for k in bins:
                t = tot[k]
                print(f"| {s} | {m} | {k} | {t[1] / t[0]:.0f} | {statistics.mean(t[2]):.2f} |", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
