#!/usr/bin/env bash
# The main job: installs missing packages, builds dsinfer, and runs a generation demo on
# the default model: models/embedded/target, a 12M-parameter Qwen3 trained by
# tools/train/ on C, Python and prose from Debian packages (a code-completion model, not a
# chat model), decoded with lossless speculation by its trained DSpark drafter
# (models/embedded/dspark: block 8, Markov + confidence heads, STS calibration); the output
# is exactly what plain greedy decoding gives. If the trained target is absent (e.g. a trimmed
# checkout), it falls back to models/demo-random: the 8k tokenizer with a random-weight
# tiny Qwen3 generated here (meaningless text, real pipeline).
# Extra arguments are passed to `dsinfer generate` (e.g. --prompt "..." --max-tokens 64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
M=models/embedded/target
if [[ ! -f $M/model.safetensors ]]; then
  M=models/demo-random
  [[ -f $M/model.safetensors ]] ||
    ./build/dsinfer make-random-model --like tiny --dtype bf16 --tokenizer "$M" --out "$M" --seed 1
fi
SPEC=()
[[ $M == models/embedded/target && -f models/embedded/dspark/model.safetensors ]] &&
  SPEC=(--spec dspark --draft-model-path models/embedded/dspark)
if (($#)); then
  exec ./build/dsinfer generate --model-path "$M" "${SPEC[@]}" "$@"
fi
PROMPT=$'#include <linux/module.h>\n#include <linux/kernel.h>\n\nstatic int __init'
printf '%s' "$PROMPT"  # the prompt, then the model's continuation streams after it
exec ./build/dsinfer generate --model-path "$M" "${SPEC[@]}" --prompt "$PROMPT" --max-tokens 80
