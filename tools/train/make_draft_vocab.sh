#!/usr/bin/env bash
# Ranks the embedded tokenizer's ids by frequency in the corpus's train split and writes
# models/embedded/target/draft_vocab.json, the ranking every drafter of the embedded set
# drafts from by default (--draft-vocab; spec/draft_vocab.h).
#
#   tools/train/make_draft_vocab.sh [CORPUS_DIR] [DEFAULT_SIZE]
#
# CORPUS_DIR: WORK/out/corpus of tools/train/build_corpus.sh (default /work/corpus/out/corpus).
# DEFAULT_SIZE: ids drafters use by default (default 256; chosen on the train-split prompts of
# models/eval/calib_mix.jsonl, see models/embedded/MODEL_CARD.md).
# Train documents that contain a shipped held-out prompt (models/eval/heldout_*.jsonl) are
# left out first: build_corpus.sh run on newer package versions can move a file between splits.
# Needs build/dsinfer. About 30 s on one core.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
CORPUS=${1:-/work/corpus/out/corpus}
SIZE=${2:-256}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 - "$CORPUS" "$REPO" "$TMP" <<'PY'
import glob, json, os, sys
corpus, repo, tmp = sys.argv[1:4]
needles = []
for f in sorted(glob.glob(os.path.join(repo, "models", "eval", "heldout_*.jsonl"))):
    for line in open(f, encoding="utf-8"):
        p = json.loads(line)["prompt"]
        needles.append(p[:200])
kept = dropped = 0
for dom in ("code-c", "code-python", "prose"):
    with open(os.path.join(tmp, dom + ".jsonl"), "w", encoding="utf-8") as out:
        for line in open(os.path.join(corpus, "train", dom + ".jsonl"), encoding="utf-8"):
            t = json.loads(line)["text"]
            if any(n in t for n in needles):
                dropped += 1
                continue
            out.write(line)
            kept += 1
print(f"make_draft_vocab: {kept} train documents kept, {dropped} containing a held-out prompt left out", flush=True)
PY
"$REPO/build/dsinfer" draft-vocab --model-path "$REPO/models/embedded/target" \
  --input "$TMP/code-c.jsonl" "$TMP/code-python.jsonl" "$TMP/prose.jsonl" \
  --output "$REPO/models/embedded/target/draft_vocab.json" --default-size "$SIZE" \
  --source "train split of tools/train/build_corpus.sh (code-c, code-python, prose; documents holding a held-out prompt left out), tokenized with models/embedded/target"
