#!/usr/bin/env python3
"""Trains dsinfer's own byte-level BPE tokenizer with Hugging Face `tokenizers`.

Same pipeline shape as Qwen3's tokenizer (NFC normalizer, the Qwen2/3 pre-tokenizer
regex split + ByteLevel, ByteLevel decoder), so the C++ tokenizer runs exactly the code
paths real Qwen3 checkpoints use. Special tokens: <|endoftext|> (end of text / pad),
<|im_start|>, <|im_end|> (ChatML), <think>, </think>, <|mask|> (DFlash/DSpark block mask).
The chat template of tokenizer_config.json is Qwen3's (copied from the tokenizer_config
given with --chat-template-from, Apache-2.0), so dsinfer detects the Qwen3 ChatML family.

Corpus: *.txt files (a directory is searched recursively) or *.jsonl files with a "text" field
per line (the build_corpus.sh layout; a directory of those is searched too with --jsonl).

Usage: python3 train_tokenizer.py --corpus DIR_OR_FILES... --vocab-size 8192 \
           --chat-template-from path/to/qwen3/tokenizer_config.json --out OUT_DIR
Deterministic for a given corpus and vocab size (the BPE trainer is deterministic).
"""
import argparse
import glob
import json
import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", nargs="+", required=True)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--chat-template-from", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--jsonl", action="store_true", help="directories hold *.jsonl ({\"text\": ...}) files")
    a = ap.parse_args()
    files = []
    for c in a.corpus:
        pat = "*.jsonl" if a.jsonl else "*.txt"
        files += sorted(glob.glob(os.path.join(c, "**", pat), recursive=True)) if os.path.isdir(c) else [c]
    tok = Tokenizer(models.BPE(byte_fallback=False, ignore_merges=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=a.vocab_size - len(SPECIALS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    if all(f.endswith(".jsonl") for f in files):
        def texts():
            for f in files:
                with open(f, encoding="utf-8") as fh:
                    for line in fh:
                        yield json.loads(line)["text"]
        tok.train_from_iterator(texts(), trainer)
    else:
        tok.train(files, trainer)
    tok.add_special_tokens(SPECIALS)
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    src = json.load(open(a.chat_template_from))
    cfg = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "model_max_length": 4096,
        "split_special_tokens": False,
        "additional_special_tokens": SPECIALS[1:],
        "chat_template": src["chat_template"],
    }
    json.dump(cfg, open(os.path.join(a.out, "tokenizer_config.json"), "w"), indent=2, ensure_ascii=False)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    print(f"train_tokenizer: {len(files)} files, vocab {tok.get_vocab_size()}, specials {ids}")
    sample = "def main():\n    return 42  # 日本語 😀"
    print("sample:", tok.encode(sample).ids, "->", repr(tok.decode(tok.encode(sample).ids)))


if __name__ == "__main__":
    main()
