#!/usr/bin/python3
"""At each first divergence of greedy_check.py: llama.cpp's top-3 probabilities for the next
token after prompt + the agreed prefix (n_probs, post-sampling off). A near tie there means
the difference is arithmetic, not a different model. usage: margin_check.py URL SPEC:AGREE..."""
import json, os, subprocess, sys, urllib.request
REPO = os.environ.get("DSINFER_REPO", str(__import__("pathlib").Path(__file__).resolve().parents[2]))
url = sys.argv[1]
for arg in sys.argv[2:]:
    kind, k, agree = arg.split(":")
    lines = [l for l in open(f"{REPO}/models/eval/heldout_{kind}.jsonl", encoding="utf-8") if l.strip()]
    prompt = json.loads(lines[int(k) - 1])["prompt"]
    ids = json.loads(subprocess.run([REPO + "/build/dsinfer", "tokenize", "--model-path", REPO + "/models/embedded/target",
                                     "--text", prompt, "--json"], capture_output=True, check=True, text=True).stdout)["ids"]
    def post(body):
        req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req).read())
    gen = post({"prompt": ids, "n_predict": int(agree), "temperature": 0, "ignore_eos": True, "return_tokens": True, "cache_prompt": False})["tokens"]
    r = post({"prompt": ids + gen, "n_predict": 1, "temperature": 0, "n_probs": 3, "post_sampling_probs": False, "cache_prompt": False})
    top = r["completion_probabilities"][0]["top_logprobs"]
    print(f"{kind}:{k} after {agree}: " + ", ".join(f"{t['id']} logprob {t['logprob']:.4f}" for t in top))
