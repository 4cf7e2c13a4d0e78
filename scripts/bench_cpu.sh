#!/usr/bin/env bash
# CPU decode benchmark for docs/PERFORMANCE.md: builds dsinfer, writes a random-weight
# model with Qwen3-0.6B's shape in BF16 to bench-models/ (git-ignored, ~1.2 GB, once), and
# runs `dsinfer bench-model` at 1 and 2 threads. Run it on a quiet machine: the roofline
# compares decode tokens/s with measured memory bandwidth / weight bytes per token.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh >/dev/null
M=bench-models/qwen3-0.6b-bf16
[[ -f $M/model.safetensors ]] || ./build/dsinfer make-random-model --like qwen3-0.6b --dtype bf16 --seed 1 --out "$M"
for t in ${THREADS:-1 2}; do
  echo "== threads $t"
  ./build/dsinfer bench-model --model-path "$M" --threads "$t" --prompt-tokens 128 --decode-tokens 64 --repeat "${REPEAT:-5}"
done
