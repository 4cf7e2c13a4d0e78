#!/usr/bin/env bash
# Puts what a device call brought back into the repository.
#   tools/train/assemble.sh FILES_AT [DEST=models/embedded]
# FILES_AT/step1/: target/ (parts of model.safetensors + sha256 + json), tokenizer/, prompts.npz, meta.json
# FILES_AT/step2/: dflash/, dspark/, zlab/ (same), gen_meta.json
# Reassembles model.safetensors from its 15 MB parts and checks the sha256.
set -euo pipefail
SRC=$1; DEST=${2:-models/embedded}
# Device calls return their staged tree as stepN.tar.part-NN (the 8-file limit of $OUT):
# unpack those first, then work on the unpacked tree.
if ls "$SRC"/step*.tar.part-* >/dev/null 2>&1; then
  U=$(mktemp -d)
  for s in 1 2; do
    ls "$SRC"/step$s.tar.part-* >/dev/null 2>&1 && cat "$SRC"/step$s.tar.part-* | tar -x -C "$U"
  done
  SRC=$U
fi
REPO=$(cd "$(dirname "$0")/../.." && pwd)
put() {  # put SRC_DIR DEST_DIR
  mkdir -p "$2"
  for f in "$1"/*; do
    case "$f" in *.part-*|*.sha256) ;; *) cp "$f" "$2/" ;; esac
  done
  cat "$1"/model.safetensors.part-* > "$2/model.safetensors"
  (cd "$2" && sed 's/ .*model.safetensors$/  model.safetensors/' "$1/model.safetensors.sha256" | sha256sum -c -)
}
if [ -d "$SRC/step1" ]; then
  put "$SRC/step1/target" "$DEST/target"
  mkdir -p "$REPO/train-data" "$DEST/train-logs"
  cp "$SRC/step1/prompts.npz" "$REPO/train-data/prompts.npz"
  cp "$SRC/step1/meta.json" "$DEST/train-logs/tokenized_corpus_meta.json"
  cp "$SRC/step1/step1.log" "$DEST/train-logs/" 2>/dev/null || true
fi
if [ -d "$SRC/step2" ]; then
  for k in dflash dspark zlab; do
    [ -d "$SRC/step2/$k" ] || continue
    d=$k; [ "$k" = zlab ] && d=dflash-zlab
    put "$SRC/step2/$k" "$DEST/$d"
  done
  mkdir -p "$DEST/train-logs"; cp "$SRC/step2/gen_meta.json" "$SRC/step2/step2.log" "$DEST/train-logs/" 2>/dev/null || true
fi
du -ab "$DEST" | tail -1
