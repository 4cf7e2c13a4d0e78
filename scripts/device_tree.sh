#!/usr/bin/env bash
# Makes the working tree small enough for one device call (the device tool sends every
# tracked file of /work/main, 64 MiB at most; with the shipped drafters it is ~84 MB).
#   scripts/device_tree.sh take   - wait for the device lock (one caller at a time: helpers
#                                   share this checkout), then take the three drafter
#                                   directories out of the index (files stay on disk, ignored
#                                   through .git/info/exclude): the tree is ~50 MB
#   scripts/device_tree.sh give   - put them back in the index, drop the exclude lines and
#                                   release the lock
# Nothing is committed. While taken, commit only with explicit paths (git commit -- PATHS)
# and never commit models/embedded. DRAFTERS="dspark" (say) keeps that drafter tracked;
# EXTRA="tests/data/tokenizer_goldens tools/train/prompts.npz" (say) takes more paths out
# (a call that keeps a drafter must shed ~5 MB elsewhere).
set -euo pipefail
cd "$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)"
LOCK=/tmp/dsinfer-device.lock
ALL="dflash dspark dflash-zlab"
KEEP=" ${DRAFTERS:-} "
EXCLUDE=.git/info/exclude
[[ -f .git ]] && EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$EXCLUDE")"; touch "$EXCLUDE"
case "${1:-}" in
  take)
    until mkdir "$LOCK" 2>/dev/null; do echo "device lock held by: $(cat "$LOCK/owner" 2>/dev/null)"; sleep 20; done
    echo "${OWNER:-$$} since $(date -u +%T)" > "$LOCK/owner"
    echo "${EXTRA:-}" > "$LOCK/extra"
    for p in ${EXTRA:-}; do
      git rm -r -q --cached --ignore-unmatch "$p"
      grep -qx "/$p" "$EXCLUDE" || echo "/$p" >> "$EXCLUDE"
    done
    for d in $ALL; do
      [[ "$KEEP" == *" $d "* ]] && continue
      git rm -r -q --cached --ignore-unmatch "models/embedded/$d"
      grep -qx "/models/embedded/$d/" "$EXCLUDE" || echo "/models/embedded/$d/" >> "$EXCLUDE"
    done
    echo "tracked tree now: $(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1) bytes"
    ;;
  give)
    git reset -q -- models/embedded
    grep -v -x -E "/models/embedded/(dflash|dspark|dflash-zlab)/" "$EXCLUDE" > "$EXCLUDE.tmp" || true
    mv "$EXCLUDE.tmp" "$EXCLUDE"
    for p in $(cat "$LOCK/extra" 2>/dev/null); do
      git reset -q -- "$p"
      grep -v -x -F "/$p" "$EXCLUDE" > "$EXCLUDE.tmp" || true
      mv "$EXCLUDE.tmp" "$EXCLUDE"
    done
    rm -rf "$LOCK"
    git status --short models/embedded | head -5
    ;;
  *) echo "usage: $0 take|give" >&2; exit 2 ;;
esac
