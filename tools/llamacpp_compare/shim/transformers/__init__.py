"""Minimal stand-in for the two `transformers` entry points llama.cpp's convert_hf_to_gguf.py
calls (Debian has no python3-transformers; PyPI is unreachable here).

- AutoConfig.from_pretrained raises, so the converter falls back to reading config.json
  itself (its own documented fallback).
- AutoTokenizer.from_pretrained returns a byte-level BPE tokenizer view of tokenizer.json:
  vocab / added tokens straight from the file; encode() runs `dsinfer tokenize` (the engine's
  tokenizer, which the converter uses only to hash its check string and to round-trip added
  tokens); decode() maps ids back to bytes through the GPT-2 byte alphabet.
Our code (dsinfer's tools/llamacpp_compare/shim), put first on sys.path by convert_embedded.py.
"""
import json
import os
import subprocess
from pathlib import Path

DSINFER = os.environ.get("DSINFER_BIN", str(Path(__file__).resolve().parents[4] / "build" / "dsinfer"))


class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers stand-in: no AutoConfig; use config.json")


class AddedToken:
    def __init__(self, d):
        self.content = d["content"]
        self.special = d.get("special", False)
        self.normalized = d.get("normalized", False)
        self.lstrip = d.get("lstrip", False)
        self.rstrip = d.get("rstrip", False)
        self.single_word = d.get("single_word", False)

    def __str__(self):
        return self.content


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class _Tokenizer:
    def __init__(self, model_dir):
        self.model_dir = str(model_dir)
        t = json.loads((Path(model_dir) / "tokenizer.json").read_text(encoding="utf-8"))
        if t["model"]["type"] != "BPE":
            raise ValueError("transformers stand-in: only BPE tokenizers")
        self.tokenizer_json = t
        self._added = {d["id"]: AddedToken(d) for d in t.get("added_tokens", [])}
        self.vocab = dict(t["model"]["vocab"])
        for i, a in self._added.items():
            self.vocab[a.content] = i
        self._rev = {i: s for s, i in self.vocab.items()}
        self._byte_of = {c: b for b, c in _bytes_to_unicode().items()}

    @property
    def added_tokens_decoder(self):
        return dict(self._added)

    def get_added_vocab(self):
        return {a.content: i for i, a in self._added.items()}

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)

    def encode(self, text, add_special_tokens=True, **kwargs):
        # No BOS/EOS is added by this tokenizer either way (add_bos_token false, no post-processor).
        r = subprocess.run([DSINFER, "tokenize", "--model-path", self.model_dir, "--json", "--text", text],
                           capture_output=True, check=True)
        return json.loads(r.stdout)["ids"]

    def decode(self, ids, **kwargs):
        out = bytearray()
        for i in ids:
            s = self._rev[i]
            if i in self._added:
                out += s.encode("utf-8")
            else:
                out += bytes(self._byte_of[c] for c in s)
        return out.decode("utf-8", errors="replace")


class AutoTokenizer:
    @staticmethod
    def from_pretrained(model_dir, *args, **kwargs):
        return _Tokenizer(model_dir)
