#!/usr/bin/python3
"""Runs llama.cpp's convert_hf_to_gguf.py on a dsinfer model directory whose BPE
pre-tokenizer hash llama.cpp does not know, declaring the pre-tokenizer type explicitly —
only after checking that tokenizer.json's pre-tokenizer (Split regex + ByteLevel without
its own regex, NFC normalizer) is the one llama-vocab.cpp implements for that type.

usage: convert_embedded.py PRE_TYPE MODEL_DIR convert_hf_to_gguf-args...
Lives in dsinfer's tools/llamacpp_compare/; llama.cpp itself stays outside the repository
(LLAMACPP_SRC, default /work/llamacpp/llama.cpp).
"""
import json
import os
import re
import sys
from pathlib import Path

LLAMA = Path(os.environ.get("LLAMACPP_SRC", "/work/llamacpp/llama.cpp"))  # a llama.cpp checkout, outside this repo
sys.path.insert(0, str(Path(__file__).resolve().parent / "shim"))
sys.path.insert(0, str(LLAMA / "gguf-py"))
sys.path.insert(0, str(LLAMA))

pre_type, model_dir = sys.argv[1], Path(sys.argv[2])
sys.argv = [str(LLAMA / "convert_hf_to_gguf.py")] + sys.argv[3:] + [str(model_dir)]

# The regex llama-vocab.cpp quotes as "original regex from tokenizer.json" for the type.
vocab_cpp = (LLAMA / "src/llama-vocab.cpp").read_text()
case = {"qwen2": "LLAMA_VOCAB_PRE_TYPE_QWEN2:"}[pre_type]
block = vocab_cpp[vocab_cpp.index("case " + case):]
block = block[:block.index("break;")]
m = re.search(r'// original regex from tokenizer\.json\s*\n\s*// "(.*)"\s*\n', block)
known = m.group(1).encode().decode("unicode_escape")

tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
pre = tj["pre_tokenizer"]
assert pre["type"] == "Sequence" and len(pre["pretokenizers"]) == 2, pre
split, bl = pre["pretokenizers"]
assert split["type"] == "Split" and split["behavior"] == "Isolated" and not split["invert"], split
assert bl == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}, bl
ours = split["pattern"]["Regex"]
if ours != known:
    sys.exit(f"pre-tokenizer regex differs from llama.cpp's {pre_type}:\n ours:  {ours!r}\n known: {known!r}")
print(f"pre-tokenizer regex identical to llama.cpp's {pre_type}: {ours!r}", file=sys.stderr)
print(f"normalizer: {tj.get('normalizer')}", file=sys.stderr)

# Debian's torch 1.13 predates the FP8 dtypes the converter names in its dtype tables; give
# them sentinel values that no tensor of this BF16 checkpoint can have.
import torch  # noqa: E402

for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
    if not hasattr(torch, _name):
        setattr(torch, _name, type(_name, (), {})())

import conversion.base as base  # noqa: E402

orig = base.TextModel.get_vocab_base_pre


def declared(self, tokenizer):
    try:
        res = orig(self, tokenizer)
        print(f"converter recognised the hash itself: {res}", file=sys.stderr)
    except NotImplementedError:
        res = None
    if res is not None and res != pre_type:
        sys.exit(f"converter says {res}, we declared {pre_type}")
    print(f"tokenizer.ggml.pre declared: {pre_type}", file=sys.stderr)
    return pre_type


base.TextModel.get_vocab_base_pre = declared

import runpy  # noqa: E402

runpy.run_path(str(LLAMA / "convert_hf_to_gguf.py"), run_name="__main__")
