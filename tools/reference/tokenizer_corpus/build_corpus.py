#!/usr/bin/env python3
"""Builds tests/data/tokenizer_corpus/*.txt: the mixed-text corpus that the tokenizer
goldens are generated from (called by build_corpus.sh, which documents the data flow).

Categories and rough byte budgets (total ~2.5 MB):
  c_cpp     C and C++ headers from /usr/include (glibc, libstdc++)      ~550 KB
  python    Python standard library sources from /usr/lib/python3.11    ~500 KB
  prose     licence texts and package READMEs (English prose)            ~450 KB
  i18n      translated messages (msgstr) from .mo files, ~25 languages   ~750 KB
  unicode   generated: emoji/ZWJ/flags, whitespace runs, CRLF, tabs,
            combining marks, NFC/NFD pairs, digit runs, rare scripts      ~250 KB
Everything is deterministic: fixed file lists, sorted catalogue keys, seeded RNG.
"""
import gettext
import glob
import gzip
import os
import random
import sys
import unicodedata

OUT = sys.argv[1]
CHUNK_MIN, CHUNK_MAX = 1024, 8192


def read_text(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"build_corpus: skipping {path}: {e}", file=sys.stderr)
        return None


def chunk(text, rng, budget):
    """Cuts `text` into chunks of CHUNK_MIN..CHUNK_MAX UTF-8 bytes at line ends."""
    lines = text.splitlines(keepends=True)
    chunks, cur, cur_len, total = [], [], 0, 0
    target = rng.randint(CHUNK_MIN, CHUNK_MAX)
    for line in lines:
        b = len(line.encode("utf-8"))
        if b > CHUNK_MAX:  # pathological long line: cut it by characters
            line = line[: CHUNK_MAX // 4]
            b = len(line.encode("utf-8"))
        if cur and cur_len + b > target:
            chunks.append("".join(cur))
            total += cur_len
            cur, cur_len = [], 0
            target = rng.randint(CHUNK_MIN, CHUNK_MAX)
            if total >= budget:
                return chunks
        cur.append(line)
        cur_len += b
    if cur and cur_len >= CHUNK_MIN // 4 and total < budget:
        chunks.append("".join(cur))
    return chunks


def from_files(paths, rng, budget, per_file_cap):
    """Concatenates the first per_file_cap bytes of each file, then chunks the stream."""
    parts = []
    for p in paths:
        t = read_text(p)
        if t is None:
            continue
        parts.append(t[:per_file_cap])
    return chunk("".join(parts), rng, budget)


C_FILES = [
    "/usr/include/stdio.h", "/usr/include/stdlib.h", "/usr/include/string.h",
    "/usr/include/unistd.h", "/usr/include/pthread.h", "/usr/include/math.h",
    "/usr/include/fcntl.h", "/usr/include/signal.h", "/usr/include/time.h",
    "/usr/include/wchar.h", "/usr/include/locale.h", "/usr/include/regex.h",
    "/usr/include/elf.h", "/usr/include/link.h", "/usr/include/dirent.h",
    "/usr/include/c++/12/bits/stl_vector.h", "/usr/include/c++/12/bits/stl_map.h",
    "/usr/include/c++/12/bits/basic_string.h", "/usr/include/c++/12/bits/shared_ptr_base.h",
    "/usr/include/c++/12/bits/unique_ptr.h", "/usr/include/c++/12/optional",
    "/usr/include/c++/12/variant", "/usr/include/c++/12/bits/stl_algo.h",
    "/usr/include/c++/12/bits/hashtable.h", "/usr/include/c++/12/format",
    "/usr/include/c++/12/ranges", "/usr/include/c++/12/chrono",
]
PY_FILES = [
    "json/__init__.py", "json/decoder.py", "json/encoder.py", "textwrap.py", "argparse.py",
    "dataclasses.py", "functools.py", "pathlib.py", "heapq.py", "bisect.py", "shlex.py",
    "string.py", "fractions.py", "statistics.py", "difflib.py", "typing.py", "csv.py",
    "enum.py", "tokenize.py", "inspect.py",
]
PROSE_FILES = [
    "/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/MPL-2.0", "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/Artistic", "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/doc/base-files/README.FHS", "/usr/share/doc/bash/README.gz",
    "/usr/share/doc/git/README.md", "/usr/share/doc/libglib2.0-0/README.md",
    "/usr/share/doc/apt/README.md.gz", "/usr/share/doc/systemd/DISTRO_PORTING.md",
    "/usr/share/doc/procps/bugs.md", "/usr/share/common-licenses/GPL-2",
    "/usr/share/doc/git/RelNotes/2.0.0.txt", "/usr/share/doc/git/RelNotes/2.39.0.txt",
    "/usr/share/doc/python3.11/NEWS.gz", "/usr/share/doc/systemd/NEWS.gz",
    "/usr/share/doc/libc6/NEWS.gz", "/usr/share/doc/catch2/docs/why-catch.md",
    "/usr/share/doc/catch2/docs/reporters.md",
]
# Languages (and the scripts they exercise); each gets the same byte budget.
LANGS = ["zh_CN", "zh_TW", "ja", "ko", "ru", "uk", "bg", "el", "ar", "he", "fa", "hi",
         "th", "vi", "de", "fr", "es", "pt_BR", "pl", "tr", "cs", "ka", "ta", "bn", "am"]
MO_DOMAINS = ["coreutils", "apt", "glib20", "dpkg", "grep", "bash", "findutils",
              "diffutils", "gettext-tools", "iso_639-3", "iso_3166-1", "gtk20", "Linux-PAM"]


def i18n(rng, budget):
    per_lang = budget // len(LANGS)
    out = []
    for lang in LANGS:
        msgs = []
        for dom in MO_DOMAINS:
            path = f"/usr/share/locale/{lang}/LC_MESSAGES/{dom}.mo"
            if not os.path.exists(path):
                continue
            try:
                with open(path, "rb") as f:
                    cat = gettext.GNUTranslations(f)._catalog
            except Exception as e:  # corrupt or unusual catalogue: skip it
                print(f"build_corpus: skipping {path}: {e}", file=sys.stderr)
                continue
            for k in sorted(cat, key=lambda k: k if isinstance(k, str) else k[0]):
                v = cat[k]
                if isinstance(v, str) and v and k:
                    msgs.append(v if v.endswith("\n") else v + "\n")
        if not msgs:
            print(f"build_corpus: no catalogues for {lang}", file=sys.stderr)
            continue
        out += chunk("".join(msgs), rng, per_lang)
    return out


def unicode_synthetic(rng, budget):
    """Generated stress text: the inputs byte-level BPE pre-tokenizers get wrong."""
    emoji = ["😀", "🦙", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "1️⃣", "❤️", "🧑🏿‍💻",
             "🫠", "🐍", "🤖", "✅", "🔥", "🥲", "👩🏻‍🔬", "🏴󠁧󠁢󠁳󠁣󠁴󠁿"]
    spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n", "\r", "\u00a0",
              "\u2003", "\u3000", "\u200b", "\u2009", " \t ", "\u202f", "\v", "\f"]
    words = ["hello", "Hello", "HELLO", "don't", "I'LL", "we've", "it's", "'s", "naïve",
             "café", "Straße", "Äpfel", "über", "日本語", "中文字符", "한국어", "Русский",
             "العربية", "עברית", "हिन्दी", "ภาษาไทย", "Ελληνικά", "ქართული", "አማርኛ",
             "tiếng Việt", "𝕳𝖊𝖑𝖑𝖔", "ｆｕｌｌｗｉｄｔｈ", "ﬁ", "Ⅻ", "½", "x²", "H₂O",
             "a\u0301", "e\u0308", "\u0301", "\u0300\u0301\u0302", "ñ", "n\u0303",
             "Å", "A\u030a", "Ω", "\u2126", "㎏", "ｶﾀｶﾅ", "가", "\u1100\u1161",
             "<|im_start|>", "<|endoftext|>", "<think>", "</think>", "<|begin_of_text|>",
             "<｜begin▁of▁sentence｜>", "<｜User｜>", "<|im_end|>", "<s>", "</s>",
             "__init__", "std::vector<int>", "->", "=>", "!==", "...", "…", "—", "--",
             "http://example.com/a?b=c&d=e", "user@example.org", "#include", "0x7fff",
             "𠀀", "\U0010fffd", "\ue000", "\ufeff", "\ufffd", "\u061c", "\u200e"]
    puncts = [".", ",", "!", "?", ";", ":", "'", '"', "(", ")", "[", "]", "{", "}", "«", "»",
              "「", "」", "。", "、", "！", "？", "¿", "¡", "§", "¶", "•", "·", "%", "$", "€"]
    out, total = [], 0
    while total < budget:
        target = rng.randint(CHUNK_MIN, CHUNK_MAX // 2)
        parts, n = [], 0
        mode = rng.randrange(6)
        while n < target:
            r = rng.random()
            if mode == 0 and r < 0.5:
                p = "".join(rng.choice(emoji) for _ in range(rng.randint(1, 4)))
            elif mode == 1 and r < 0.5:
                p = rng.choice(spaces) * rng.randint(1, 12)
            elif mode == 2 and r < 0.5:
                p = str(rng.randrange(10 ** rng.randint(1, 20)))
                if rng.random() < 0.3:
                    p = f"{p[:3]},{p[3:]}.{rng.randrange(1000)}"
            elif mode == 3 and r < 0.5:
                w = rng.choice(words)
                p = unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKC", "NFKD"]), w)
            elif mode == 4 and r < 0.5:
                p = "".join(chr(rng.choice([rng.randrange(0x20, 0x7f), rng.randrange(0xa0, 0x800),
                                            rng.randrange(0x800, 0xd800),
                                            rng.randrange(0xe000, 0xfffe),
                                            rng.randrange(0x10000, 0x30000)]))
                            for _ in range(rng.randint(1, 8)))
            elif r < 0.7:
                p = rng.choice(words)
            elif r < 0.85:
                p = rng.choice(spaces)
            else:
                p = rng.choice(puncts) * rng.randint(1, 3)
            if rng.random() < 0.6:
                p += rng.choice([" ", " ", "\n", "", "\t", "\r\n"])
            parts.append(p)
            n += len(p.encode("utf-8"))
        text = "".join(parts)
        # Keep the corpus text-only: no C0 controls except \t \n \r \v \f, no NUL.
        text = "".join(c for c in text if c >= " " or c in "\t\n\r\v\f")
        if not text:
            continue
        out.append(text)
        total += len(text.encode("utf-8"))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    for old in glob.glob(os.path.join(OUT, "*.txt")):
        os.remove(old)
    pylib = "/usr/lib/python3.11"
    cats = [
        ("c_cpp", lambda r: from_files(C_FILES, r, 550_000, 60_000)),
        ("python", lambda r: from_files([f"{pylib}/{p}" for p in PY_FILES], r, 500_000, 50_000)),
        ("prose", lambda r: from_files(PROSE_FILES, r, 450_000, 80_000)),
        ("i18n", lambda r: i18n(r, 750_000)),
        ("unicode", lambda r: unicode_synthetic(r, 250_000)),
    ]
    total = 0
    for seed, (name, fn) in enumerate(cats):
        chunks = fn(random.Random(1000 + seed))
        size = 0
        for i, c in enumerate(chunks):
            with open(os.path.join(OUT, f"{name}_{i:04d}.txt"), "w", encoding="utf-8",
                      newline="") as f:
                f.write(c)
            size += len(c.encode("utf-8"))
        print(f"build_corpus: {name}: {len(chunks)} chunks, {size} bytes", file=sys.stderr)
        total += size
    print(f"build_corpus: total {total} bytes in {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
