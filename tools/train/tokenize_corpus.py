#!/usr/bin/env python3
"""Tokenizes the corpus (corpus/{train,heldout}/<domain>.jsonl) into flat uint16 token streams
OUT/{split}/{domain}.bin, one <|endoftext|> after every document, plus OUT/meta.json.

With HF `tokenizers` (GPU machine): batched, multi-threaded. Without it (Debian CPU box):
falls back to `dsinfer tokenize` per document (slow; for --max-docs toy runs only).

  python3 tokenize_corpus.py --corpus CORPUS_DIR --tokenizer TOK_DIR --out OUT [--max-docs N]
"""
import argparse
import glob
import json
import os
import subprocess
import tempfile
import time

import numpy as np


def dsinfer_encoder(binary, tok_dir):
    def enc(texts):
        out = []
        for t in texts:
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(t)
            r = subprocess.run([binary, "tokenize", "--model-path", tok_dir, "--file", f.name, "--json"],
                               capture_output=True, text=True, check=True)
            os.unlink(f.name)
            out.append(json.loads(r.stdout)["ids"])
        return out
    return enc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True, help="directory with tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-docs", type=int, default=0, help="per split/domain (0 = all)")
    ap.add_argument("--dsinfer", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "dsinfer"))
    a = ap.parse_args()
    tok_json = json.load(open(os.path.join(a.tokenizer, "tokenizer.json")))
    specials = {t["content"]: t["id"] for t in tok_json.get("added_tokens", [])}
    eot = specials["<|endoftext|>"]
    try:
        from tokenizers import Tokenizer
        tk = Tokenizer.from_file(os.path.join(a.tokenizer, "tokenizer.json"))
        vocab = tk.get_vocab_size()

        def enc(texts):
            return [e.ids for e in tk.encode_batch(texts, add_special_tokens=False)]
        how = "tokenizers"
    except ImportError:
        enc = dsinfer_encoder(os.path.abspath(a.dsinfer), a.tokenizer)
        vocab = max(specials.values()) + 1
        how = "dsinfer"
    assert vocab <= 65536
    meta = {"tokenizer": os.path.abspath(a.tokenizer), "eot_id": eot, "vocab_size": vocab, "via": how, "splits": {}}
    t0 = time.time()
    for f in sorted(glob.glob(os.path.join(a.corpus, "*", "*.jsonl"))):
        split, dom = os.path.basename(os.path.dirname(f)), os.path.basename(f)[:-6]
        os.makedirs(os.path.join(a.out, split), exist_ok=True)
        docs, ntok, nbytes = [], 0, 0
        with open(f) as fh, open(os.path.join(a.out, split, dom + ".bin"), "wb") as out:
            def flush():
                nonlocal ntok
                for ids in enc(docs):
                    arr = np.asarray(ids + [eot], dtype=np.uint16)
                    out.write(arr.tobytes())
                    ntok += len(arr)
                docs.clear()
            for i, line in enumerate(fh):
                if a.max_docs and i >= a.max_docs:
                    break
                t = json.loads(line)["text"]
                nbytes += len(t.encode())
                docs.append(t)
                if len(docs) >= 2000:
                    flush()
            flush()
        meta["splits"].setdefault(split, {})[dom] = {"tokens": ntok, "bytes": nbytes,
                                                      "bytes_per_token": round(nbytes / max(ntok, 1), 3)}
        print(f"tokenize_corpus: {split}/{dom}: {ntok} tokens, {nbytes/max(ntok,1):.2f} bytes/token "
              f"({time.time()-t0:.0f}s)", flush=True)
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
