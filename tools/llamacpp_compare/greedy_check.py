#!/usr/bin/python3
"""Greedy continuations of the same prompt ids: dsinfer (generate, plain decoding, 1 thread)
vs llama.cpp (llama-server /completion, temperature 0 = argmax, return_tokens).
Prints, per prompt, how many of the first N generated ids agree before the first difference.
usage: greedy_check.py LLAMA_SERVER_URL N PROMPTS...   (each prompt: code:K or python:K, a
held-out line number)
"""
import json
import os
import subprocess
import sys
import urllib.request

REPO = os.environ.get("DSINFER_REPO", str(__import__("pathlib").Path(__file__).resolve().parents[2]))
DSINFER = REPO + "/build/dsinfer"
MODEL = REPO + "/models/embedded/target"
url, n = sys.argv[1], int(sys.argv[2])
IGNORE_EOS = os.environ.get("IGNORE_EOS", "1") == "1"  # 0: both stop at their end-of-generation tokens
total_agree = total = 0
for spec in sys.argv[3:]:
    kind, k = spec.split(":")
    lines = [l for l in open(f"{REPO}/models/eval/heldout_{kind}.jsonl", encoding="utf-8") if l.strip()]
    prompt = json.loads(lines[int(k) - 1])["prompt"]
    ids = json.loads(subprocess.run([DSINFER, "tokenize", "--model-path", MODEL, "--text", prompt, "--json"],
                                    capture_output=True, check=True, text=True).stdout)["ids"]
    ds = json.loads(subprocess.run([DSINFER, "generate", "--model-path", MODEL, "--prompt-ids", ",".join(map(str, ids)),
                                    "--max-tokens", str(n)] + (["--ignore-eos"] if IGNORE_EOS else []) + ["--spec", "none", "--threads", "1", "--json"],
                                   capture_output=True, check=True, text=True).stdout)["ids"]
    body = {"prompt": ids, "n_predict": n, "temperature": 0, "ignore_eos": IGNORE_EOS, "return_tokens": True,
            "cache_prompt": False, "stream": False}
    req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    lc = json.loads(urllib.request.urlopen(req).read())["tokens"]
    agree = next((i for i in range(min(len(ds), len(lc))) if ds[i] != lc[i]), min(len(ds), len(lc)))
    total_agree += agree
    m = n if IGNORE_EOS else min(len(ds), len(lc))
    total += m
    print(f"{spec}: {len(ids)} prompt tokens; first {agree}/{m} generated ids agree" +
          ("" if IGNORE_EOS else f" (dsinfer generated {len(ds)}, llama.cpp {len(lc)})") +
          ("" if agree == m else f" (dsinfer {ds[agree:agree+3]} vs llama.cpp {lc[agree:agree+3]})"))
print(f"total: {total_agree}/{total} ids before the first difference")
