#!/usr/bin/env python3
"""Reference token ids for dsinfer's tokenizer conformance test, made with Hugging Face
`tokenizers` (the Rust library that transformers' fast tokenizers wrap; no torch needed).

Data flow: tokenizer.json -> tokenizers.Tokenizer; texts = built-in edge cases (below)
+ every *.txt file of the corpus directory (one file = one text, read as exact bytes);
each text -> encode(text, add_special_tokens=False).ids -> one JSON line
{"text": ..., "ids": [...], "source": ...} in the output file. A sidecar
<output>.meta.json records the tokenizers version and the tokenizer.json sha256 so a
mismatch can be traced to the reference that produced it.

The C++ test (tests/unit/test_tokenizer_conformance.cpp) reads every line and requires
identical ids. Special-token strings in the text are matched as added tokens, exactly as
`tokenizers` does by default; dsinfer's encode(text, parse_special=true) must agree.

Usage:
  pip install tokenizers==0.21.1
  python3 tools/reference/tokenizer_goldens.py TOKENIZER_JSON NAME CORPUS_DIR OUT_JSONL
"""
import argparse
import glob
import hashlib
import json
import os
import sys

# Strings that byte-level BPE implementations commonly get wrong. Kept in this file (not
# the corpus) so that they are always the first lines of every golden file.
EDGE_CASES = [
    "", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n",
    "\n ", " \n \n", "a\n\n\nb", "  leading", "trailing  ", "   \t\n  mixed \r\n\t ",
    "Hello world", " Hello world", "Hello World!", "hello,world", "HELLO", "Hello\u00a0world",
    "don't", "DON'T", "I'LL", "I'll", "we've", "you'd", "it's", "'s", "'", "''", "'''",
    "don't I'LL we'Ve they'RE", "rock 'n' roll", "o'clock", "’s", "don’t",
    "1", "12", "123", "1234", "12345", "1234567", "1234567890123456789", "3.14159",
    "1,000,000", "-42", "+1e-10", "0x7FFF", "v1.2.3", "2024-06-01T12:00:00Z", "٣٤٥", "१२३",
    "①②③", "Ⅻ", "½", "x²", "१२३४५",
    "日本語のテキスト", "中文字符测试", "한국어 텍스트", "Русский текст", "Ελληνικά",
    "العربية", "עברית", "हिन्दी", "ภาษาไทย", "tiếng Việt", "ქართული", "አማርኛ",
    "English 日本語 Русский العربية mixed 123 😀",
    "\u0301", "\u0301a", "a\u0301", "e\u0301\u0302\u0303", "\u0300\u0301\u0302 ",
    "café", "cafe\u0301", "Å", "A\u030a", "\u212b", "ﬁ", "ｆｕｌｌｗｉｄｔｈ", "㎏", "ｶﾀｶﾅ",
    "\u1100\u1161\u11a8", "가각", "𝕳𝖊𝖑𝖑𝖔", "𠀀𠀁", "\U0010fffd", "\ue000", "\ufeff",
    "\ufeffBOM at start", "\ufffd", "\u200b", "a\u200bb", "\u200d", "\u2028", "\u3000",
    "\x00", "a\x00b", "\x01\x02\x1f\x7f", "\x0b\x0c", "\u0085",
    "😀", "🦙", "this is 🦙.cpp", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵🇺🇸", "1️⃣", "❤️",
    "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "😀😀😀😀😀😀",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<think>\n\n</think>\n\n",
    "<tool_call>", "<|begin_of_text|>Hello", "<|eot_id|>", "<|start_header_id|>user<|end_header_id|>",
    "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>", "<｜end▁of▁sentence｜>",
    "text<|endoftext|>text", " <|endoftext|> ", "<|endoftext", "<|endoftext|><|endoftext|>",
    "<s>", "</s>", "<unk>", "<pad>",
    "def f(x):\n    return x * 2\n", "\tif (a) {\n\t\treturn;\n\t}\n", "int main() { return 0; }",
    "std::vector<int> v{1, 2, 3};", "#!/usr/bin/env python3", "<html><body>Hi</body></html>",
    "{\"key\": [1, 2.5, null, true]}", "http://example.com/path?q=1&r=two#frag",
    "user@example.org", "C:\\Windows\\System32", "$ ls -la | grep foo > /dev/null 2>&1",
    "a" * 1000, " " * 1000, "\n" * 200, "ab" * 300, "1" * 300, "😀" * 100,
    ".!?" * 50, "— – - ‐ ‑ ‒", "«quoted» „quoted“ “quoted”", "…...",
]


def special_token_cases(tok_json):
    """Inline uses of this tokenizer's own added tokens (first 8 special, 8 not)."""
    added = tok_json.get("added_tokens", [])
    special = [a["content"] for a in added if a.get("special")][:8]
    normal = [a["content"] for a in added if not a.get("special")][:8]
    out = []
    for s in special + normal:
        out += [s, f"before{s}after", f" {s} ", f"\n{s}\n", s + s]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tokenizer_json")
    ap.add_argument("name", help="qwen3 | llama3 | deepseek_v3 (recorded in the meta file)")
    ap.add_argument("corpus_dir")
    ap.add_argument("out_jsonl")
    args = ap.parse_args()

    import tokenizers  # imported late so --help works without it

    with open(args.tokenizer_json, "rb") as f:
        raw = f.read()
    tok = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    tok_json = json.loads(raw)

    texts = [(t, "edge") for t in EDGE_CASES]
    texts += [(t, "edge-added") for t in special_token_cases(tok_json)]
    files = sorted(glob.glob(os.path.join(args.corpus_dir, "*.txt")))
    if not files:
        sys.exit(f"tokenizer_goldens: no *.txt in {args.corpus_dir}")
    for p in files:
        with open(p, "rb") as f:
            texts.append((f.read().decode("utf-8"), "corpus/" + os.path.basename(p)))

    n_ids = 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out_jsonl)), exist_ok=True)
    with open(args.out_jsonl, "w", encoding="utf-8", newline="\n") as out:
        for text, source in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            n_ids += len(ids)
            out.write(json.dumps({"text": text, "ids": ids, "source": source},
                                 ensure_ascii=False) + "\n")
    meta = {
        "name": args.name,
        "tokenizers_version": tokenizers.__version__,
        "tokenizer_json_sha256": hashlib.sha256(raw).hexdigest(),
        "texts": len(texts),
        "ids": n_ids,
        "add_special_tokens": False,
    }
    with open(args.out_jsonl + ".meta.json", "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"tokenizer_goldens: {args.name}: {len(texts)} texts, {n_ids} ids -> {args.out_jsonl}")


if __name__ == "__main__":
    main()
