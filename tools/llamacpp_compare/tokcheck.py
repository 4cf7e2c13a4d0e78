#!/usr/bin/python3
"""Token ids of the held-out prompts behind `dsinfer bench --preset code` and `--preset chat`:
dsinfer vs llama.cpp (llama-tokenize on the GGUF).

code: each prompt of models/eval/heldout_{code,python}.jsonl, raw text:
      `dsinfer tokenize --file P --json`  vs  `llama-tokenize -m GGUF -f P --ids --no-escape` (no escape processing: the bytes as they are).
chat: each chat request as sent by the preset; dsinfer's ids are the rendered prompt ids of
      a `dsinfer serve --record-requests` log (template + tokenizer), llama.cpp's are
      `llama-tokenize` (special tokens parsed, its default; dsinfer tokenize parses them too) of the prompt llama-server's /apply-template renders
      for the same messages (template + tokenizer).
usage: tokcheck.py code  | tokcheck.py chat RECORD_LOG LLAMA_SERVER_URL
"""
import os
import json
import subprocess
import sys
import tempfile
import urllib.request

REPO = os.environ.get("DSINFER_REPO", str(__import__("pathlib").Path(__file__).resolve().parents[2]))
DSINFER = REPO + "/build/dsinfer"
MODEL = REPO + "/models/embedded/target"
LT = os.environ.get("LLAMA_TOKENIZE", "/work/llamacpp/llama.cpp/build/bin/llama-tokenize")
GGUF = os.environ.get("GGUF", "/work/llamacpp/gguf/target-BF16.gguf")


def llama_ids(text, special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        cmd = [LT, "-m", GGUF, "-f", f.name, "--ids", "--log-disable", "--no-escape"]
        out = subprocess.run(cmd, capture_output=True, check=True, text=True).stdout.strip().splitlines()[-1]
    return json.loads(out)


def dsinfer_ids(text):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt") as f:
        f.write(text.encode("utf-8"))
        f.flush()
        r = subprocess.run([DSINFER, "tokenize", "--model-path", MODEL, "--file", f.name, "--json"],
                           capture_output=True, check=True, text=True)
    return json.loads(r.stdout)["ids"]


def report(name, pairs):
    same = sum(a == b for _, a, b in pairs)
    ntok = sum(len(a) for _, a, _ in pairs)
    print(f"{name}: {same}/{len(pairs)} prompts identical ({ntok} dsinfer tokens in all)")
    for label, a, b in pairs:
        if a != b:
            k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
            print(f"  DIFF {label}: len {len(a)} vs {len(b)}, first difference at {k}: {a[k:k+5]} vs {b[k:k+5]}")
    return same == len(pairs)


def main():
    if sys.argv[1] == "code":
        pairs = []
        for f in ("heldout_code", "heldout_python"):
            for n, line in enumerate(open(f"{REPO}/models/eval/{f}.jsonl", encoding="utf-8")):
                if not line.strip():
                    continue
                p = json.loads(line)["prompt"]
                pairs.append((f"{f}:{n + 1}", dsinfer_ids(p), llama_ids(p, special=False)))
        ok = report("code", pairs)
    else:
        log, url = sys.argv[2], sys.argv[3]
        pairs = []
        for n, line in enumerate(open(log, encoding="utf-8")):
            rec = json.loads(line)
            if rec["endpoint"] != "/v1/chat/completions":
                continue
            req = urllib.request.Request(url + "/apply-template", data=json.dumps({"messages": rec["messages"]}).encode(),
                                         headers={"Content-Type": "application/json"})
            prompt = json.loads(urllib.request.urlopen(req).read())["prompt"]
            pairs.append((f"record {n + 1}", rec["prompt_ids"], llama_ids(prompt, special=True)))
        ok = report("chat", pairs)
    sys.exit(0 if ok else 1)


main()
