#!/usr/bin/env python3
"""Writes the tiny tokenizer.json fixtures used by tests/unit/test_tokenizer_*.cpp.

Every fixture is a byte-level BPE whose base vocabulary is the 256 GPT-2 byte stand-ins
with id == byte value, plus a handful of merges, so expected ids can be worked out by
hand (the unit tests explain each one). Re-run after editing; the output is committed.
  tiny_bytelevel/     Qwen-style Split regex + ByteLevel, NFC, merges as [a, b] arrays,
                      added tokens covering special / lstrip / rstrip / single_word /
                      normalized flags; Qwen3-like chat template (ChatML + enable_thinking)
  tiny_string_merges/ same model with merges as "a b" strings and ignore_merges = true
  tiny_deepseek_v3/   DeepSeek-V3 chat template (no thinking markers)
  tiny_deepseek_v4/   no chat_template, DeepSeek role tokens in the vocab (V3.2/V4 style)
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
QWEN_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or")]


def added(id_, content, special, lstrip=False, rstrip=False, single_word=False, normalized=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip,
            "rstrip": rstrip, "normalized": normalized, "special": special}


def model(string_merges=False, ignore_merges=False, extra_vocab=()):
    vocab = {B2U[b]: b for b in range(256)}
    nid = 256
    for a, b in MERGES:
        vocab[a + b] = nid
        nid += 1
    for tok in extra_vocab:
        vocab[tok] = nid
        nid += 1
    merges = [f"{a} {b}" for a, b in MERGES] if string_merges else [[a, b] for a, b in MERGES]
    return {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}


def tokenizer(mdl, added_tokens):
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": mdl,
    }


QWEN_ADDED = [
    added(300, "<|im_start|>", True), added(301, "<|im_end|>", True), added(302, "<think>", False),
    added(303, "[LS]", True, lstrip=True), added(304, "[RS]", True, rstrip=True),
    added(305, "[SW]", False, single_word=True), added(306, "<|endoftext|>", True),
    added(307, "</think>", False), added(308, "café", False, normalized=True),
]
QWEN_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
                 "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
                 "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
                 "{%- endif %}{%- endif %}")
DS_V3_TEMPLATE = ("{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] == 'user' %}"
                  "{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' %}"
                  "{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor -%}"
                  "{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %}")
DS_ADDED = [added(300, "<｜begin▁of▁sentence｜>", True), added(301, "<｜end▁of▁sentence｜>", True),
            added(302, "<｜User｜>", False), added(303, "<｜Assistant｜>", False),
            added(304, "<think>", False), added(305, "</think>", False)]


def write(name, tok, config):
    d = os.path.join(HERE, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)
        f.write("\n")


write("tiny_bytelevel", tokenizer(model(extra_vocab=["Ġworld"]), QWEN_ADDED),
      {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": QWEN_TEMPLATE})
write("tiny_string_merges", tokenizer(model(string_merges=True, ignore_merges=True, extra_vocab=["Ġworld"]), QWEN_ADDED),
      {"eos_token": {"content": "<|endoftext|>", "__type": "AddedToken"}})
write("tiny_deepseek_v3", tokenizer(model(), DS_ADDED),
      {"bos_token": {"content": "<｜begin▁of▁sentence｜>"}, "eos_token": "<｜end▁of▁sentence｜>",
       "chat_template": DS_V3_TEMPLATE})
write("tiny_deepseek_v4", tokenizer(model(), DS_ADDED),
      {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"})
