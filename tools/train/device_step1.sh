#!/usr/bin/env bash
# Device call 1 (GPU machine, <= 10 min): corpus -> tokenizer -> token streams -> target.
#   carry: train-data/corpus.tar.xz      returns under $OUT: step1/ (see README.md)
# Env: TOTAL_S (default 570: the whole call's wall budget), SEED (1), VOCAB (8192).
set -euo pipefail
T0=$(date +%s); TOTAL_S=${TOTAL_S:-570}; SEED=${SEED:-1}; VOCAB=${VOCAB:-8192}
W=train-work; STAGE=${STAGE:-/tmp/dsinfer-stage}; O=$STAGE/step1; mkdir -p "$W" "$O"
el() { echo $(( $(date +%s) - T0 )); }
exec > >(tee "$O/step1.log") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv || true
python3 -c "import torch, tokenizers, numpy; print('torch', torch.__version__, 'tokenizers', tokenizers.__version__)"
if [ ! -f "$W/corpus/.ok" ]; then
  xz -dc train-data/corpus.tar.xz | tar -x -C "$W" && touch "$W/corpus/.ok"
fi
echo "[$(el)s] corpus unpacked"; du -sh "$W/corpus"
if [ ! -f "$W/tokenizer/tokenizer.json" ]; then
  python3 tools/train/train_tokenizer.py --corpus "$W/corpus/train" --jsonl --vocab-size "$VOCAB" \
    --chat-template-from models/demo-random/tokenizer_config.json --out "$W/tokenizer"
fi
echo "[$(el)s] tokenizer trained"
[ -f "$W/tok/meta.json" ] || python3 tools/train/tokenize_corpus.py --corpus "$W/corpus" --tokenizer "$W/tokenizer" --out "$W/tok"
echo "[$(el)s] corpus tokenized"
[ -f "$W/prompts.npz" ] || python3 tools/train/gen_drafter_data.py --make-prompts --data "$W/tok" --out "$W/prompts.npz"
cp "$W/prompts.npz" "$W/tok/meta.json" "$O/"
mkdir -p "$O/tokenizer"; cp "$W/tokenizer/"* "$O/tokenizer/"
LEFT=$(( TOTAL_S - $(el) - 50 ))            # 50 s for final eval, save, reload checks, copy
MIN=$(python3 -c "print(max(0.5, $LEFT/60))")
echo "[$(el)s] training the target for $MIN min"
python3 tools/train/train_target.py --data "$W/tok" --tokenizer "$W/tokenizer" --out "$W/target" \
  --max-minutes "$MIN" --seed "$SEED" --compile ${TARGET_ARGS:-}
echo "[$(el)s] target done"
mkdir -p "$O/target"
cp "$W/target/"{config.json,generation_config.json,tokenizer.json,tokenizer_config.json,train_summary.json,train_log.jsonl} "$O/target/"
( cd "$W/target" && sha256sum model.safetensors ) > "$O/target/model.safetensors.sha256"
split -b 15000000 -d "$W/target/model.safetensors" "$O/target/model.safetensors.part-"
ls -la "$O" "$O/target"; echo "[$(el)s] step 1 done"
# Only 8 files (16 MB each) come back from $OUT: send the staged tree as one tar in 15 MB parts.
mkdir -p "${OUT:-/tmp/out}"
tar -C "$STAGE" -cf - step1 | split -b 15000000 -d - "${OUT:-/tmp/out}/step1.tar.part-"
ls -la "${OUT:-/tmp/out}"
