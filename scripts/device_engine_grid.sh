#!/bin/bash
# The issue-5 grid on the GPU machine, run by scripts/cuda_device_run.sh with STEPS="grid"
# (which unpacks build-cuda/dev and sets LD_LIBRARY_PATH): dsinfer bench-engine --device
# cuda on the embedded target with the shipped DSpark drafter (the tree must carry
# models/embedded/dspark: DRAFTERS=dspark for scripts/device_tree.sh), held-out code
# prompts, 256-token prompts, 256 new tokens.
# GRID_POLICIES (default none,dspark,dspark+lookup) x GRID_CONCURRENCY (default
# 1,4,16,64,128), GRID_RUNS runs (default 1) per VARIANTS entry; an entry is "name" or
# "name:VAR=VALUE[+VAR=VALUE...]" (environment for that run, e.g.
# "host-features:DSINFER_CUDA_DEVICE_FEATURES=0"). The table and stderr in $OUT/grid_<name>_<run>.txt.
set -u
R=$PWD
OUT=${OUT:-/tmp/dsinfer-out}
DEV=$R/build-cuda/dev
for entry in ${VARIANTS:-default}; do
  name=${entry%%:*}
  envs=()
  [[ "$entry" == *:* ]] && IFS='+' read -r -a envs <<< "${entry#*:}"
  for run in $(seq 1 "${GRID_RUNS:-1}"); do
    env "${envs[@]}" "$DEV/dsinfer" bench-engine --model-path models/embedded/target \
      --draft-model-path models/embedded/dspark --device cuda --prompts models/eval/heldout_code.jsonl \
      --prompt-tokens 256 --rounds-per-slot 2 --max-tokens 256 --concurrency "${GRID_CONCURRENCY:-1,4,16,64,128}" \
      --policies "${GRID_POLICIES:-none,dspark,dspark+lookup}" > "$OUT/grid_${name}_${run}.txt" 2>&1
    echo "grid $name run $run: rc $?"
  done
done
