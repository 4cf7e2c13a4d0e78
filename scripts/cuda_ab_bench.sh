#!/bin/bash
# Same-call A/B of batch-1 decode on the GPU machine (run after scripts/cuda_device_run.sh has
# unpacked build-cuda/dev and made /tmp/q4b): for each round, every binary in AB_BINS
# (default: build-cuda/dev/dsinfer) under every environment in AB_VARIANTS (space-separated
# VAR=VALUE[+VAR=VALUE...], "-" for none; default "-") runs bench-model on the random
# Qwen3-4B-shaped checkpoint with AB_ARGS (default: --cuda-gemm rows, graphs on, prompt 32, 128
# decode tokens, best of 3), interleaved, AB_ROUNDS rounds (default 2), so that machine drift
# hits every variant alike. One line per run; JSON in $OUT/ab_*.json.
set -u
OUT=${OUT:-/tmp/dsinfer-out}
mkdir -p "$OUT"
BINS=${AB_BINS:-build-cuda/dev/dsinfer}
ARGS=${AB_ARGS:---cuda-gemm rows --cuda-graphs on --prompt-tokens 32 --decode-tokens 128 --repeat 3}
for r in $(seq 1 "${AB_ROUNDS:-2}"); do
  for b in $BINS; do
    for v in ${AB_VARIANTS:--}; do
      envs=(); [ "$v" != - ] && IFS=+ read -ra envs <<< "$v"
      name=ab_$(basename "$b")_$(echo "$v" | tr -c 'A-Za-z0-9\n' _)_$r
      env "${envs[@]}" timeout 200 "$b" bench-model --model-path /tmp/q4b --device cuda $ARGS --json > "$OUT/$name.json" 2> "$OUT/$name.err"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'decode %.1f (median %.1f) tokens/s, %.2f %% of %.0f GB/s' % (j['decode_tokens_per_s'], j['decode_tokens_per_s_median'], j['roofline_pct'], j['memory_bandwidth_gbs']))" \
        "$OUT/$name.json" "$(basename "$b") $v round $r" || tail -3 "$OUT/$name.err"
    done
  done
done
