#!/usr/bin/env bash
# Device call 2 (GPU machine, <= 10 min): target continuations -> DFlash + DSpark (+ z-lab) drafters.
#   needs in the working tree: models/embedded/target/ (restored from call 1);
#   carry: train-data/prompts.npz         returns under $OUT: step2/ (see README.md)
# Env: TOTAL_S (575), GEN_MIN (2.5), SEED (42), KINDS (dflash,dspark,zlab), TARGET (models/embedded/target).
set -euo pipefail
T0=$(date +%s); TOTAL_S=${TOTAL_S:-575}; SEED=${SEED:-42}; KINDS=${KINDS:-dflash,dspark,zlab}
TARGET=${TARGET:-models/embedded/target}
# The prompts made by step 1 are committed as tools/train/prompts.npz (4.8 MB), so step 2
# runs from a fresh clone without carrying them.
if [ ! -f train-data/prompts.npz ] && [ -f tools/train/prompts.npz ]; then mkdir -p train-data; cp tools/train/prompts.npz train-data/; fi; GEN_MIN=${GEN_MIN:-2.5}
W=train-work; STAGE=${STAGE:-/tmp/dsinfer-stage}; O=$STAGE/step2; mkdir -p "$W" "$O"
el() { echo $(( $(date +%s) - T0 )); }
exec > >(tee "$O/step2.log") 2>&1
(cd "$TARGET" && sha256sum -c model.safetensors.sha256 2>/dev/null || true)
[ -f "$W/gen/meta.json" ] || python3 tools/train/gen_drafter_data.py --target "$TARGET" --prompts train-data/prompts.npz \
  --out "$W/gen" --max-minutes "$GEN_MIN" --seed 7 ${GEN_ARGS:-}
cp "$W/gen/meta.json" "$O/gen_meta.json"
echo "[$(el)s] drafter data generated"
LEFT=$(( TOTAL_S - $(el) - 40 ))
MIN=$(python3 -c "print(max(0.5, $LEFT/60))")
echo "[$(el)s] training $KINDS for $MIN min"
python3 tools/train/train_drafter.py --target "$TARGET" --gen "$W/gen" --kind "$KINDS" --out "$W/drafters" \
  --max-minutes "$MIN" --seed "$SEED" --compile ${DRAFTER_ARGS:-}
for k in ${KINDS//,/ }; do
  mkdir -p "$O/$k"; cp "$W/drafters/$k/"{config.json,train_summary.json,train_log.jsonl} "$O/$k/"
  ( cd "$W/drafters/$k" && sha256sum model.safetensors ) > "$O/$k/model.safetensors.sha256"
  split -b 15000000 -d "$W/drafters/$k/model.safetensors" "$O/$k/model.safetensors.part-"
done
ls -la "$O"/*; echo "[$(el)s] step 2 done"
# Only 8 files (16 MB each) come back from $OUT: send the staged tree as one tar in 15 MB parts.
mkdir -p "${OUT:-/tmp/out}"
tar -C "$STAGE" -cf - step2 | split -b 15000000 -d - "${OUT:-/tmp/out}/step2.tar.part-"
ls -la "${OUT:-/tmp/out}"
