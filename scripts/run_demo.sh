#!/usr/bin/env bash
# The main job: installs missing packages, builds dsinfer, and runs a generation demo on
# the default model. Until the trained models of issue 4 ship, the default is
# models/demo-random: a real 8k BPE tokenizer with a random-weight tiny Qwen3 generated
# here on first run (so the text is meaningless; the whole pipeline is real).
# Extra arguments are passed to `dsinfer generate` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
M=models/demo-random
if [[ ! -f $M/model.safetensors ]]; then
  ./build/dsinfer make-random-model --like tiny --dtype bf16 --tokenizer "$M" --out "$M" --seed 1
fi
if (($#)); then
  exec ./build/dsinfer generate --model-path "$M" "$@"
fi
exec ./build/dsinfer generate --model-path "$M" --chat --prompt "Write a C function that adds two integers." \
  --max-tokens 48 --temperature 0.8 --top-p 0.95 --seed 1
