#!/usr/bin/env bash
# Verifies the shipped embedded set: byte budget and loading with the dsinfer binary.
#   tools/train/check_shipped_set.sh [DIR=models/embedded] [BUDGET_BYTES=64000000]
# Counts every file the models ship (target/, dflash/, dspark/, dflash-zlab/, MODEL_CARD.md),
# not train-logs/. Then `dsinfer debug-dflash` must load each drafter with the expected kind,
# and, when /usr/bin/python3 has torch, tools/train/check_layouts.py cross-checks the layouts
# against the PyTorch reference.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-$REPO/models/embedded}; BUDGET=${2:-64000000}
BIN=${DSINFER:-$REPO/build/dsinfer}
fail() { echo "check_shipped_set: FAIL: $*"; exit 1; }
total=0
for p in "$DIR"/target "$DIR"/dflash "$DIR"/dspark "$DIR"/dflash-zlab "$DIR"/MODEL_CARD.md; do
  [ -e "$p" ] || continue
  n=$(find "$p" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
  printf '%-40s %12d bytes\n' "${p#$REPO/}" "$n"; total=$((total + n))
done
printf '%-40s %12d bytes (budget %d)\n' total "$total" "$BUDGET"
[ "$total" -le "$BUDGET" ] || fail "over budget"
for f in config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json; do
  [ -f "$DIR/target/$f" ] || fail "target/$f missing"
done
expect() {  # expect DRAFT_DIR KIND
  [ -d "$1" ] || { echo "skip $1 (absent)"; return 0; }
  out=$("$BIN" debug-dflash --model-path "$DIR/target" --draft-model-path "$1" --prompt-ids 1,2,3,4,5 --json --threads 1) \
    || fail "dsinfer cannot load $1"
  kind=$(printf '%s' "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["kind"], d["dialect"], d["block_size"], d["accepted"])')
  echo "$1: kind dialect block_size accepted = $kind"
  [ "${kind%% *}" = "$2" ] || fail "$1 loads as ${kind%% *}, expected $2"
}
expect "$DIR/dflash" dflash-deepspec
expect "$DIR/dspark" dspark
expect "$DIR/dflash-zlab" dflash
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  ds=(); for d in dflash dspark dflash-zlab; do [ -d "$DIR/$d" ] && ds+=("$DIR/$d"); done
  /usr/bin/python3 "$REPO/tools/train/check_layouts.py" --target "$DIR/target" --drafters "${ds[@]}" --dsinfer "$BIN"
fi
echo "check_shipped_set: OK"
