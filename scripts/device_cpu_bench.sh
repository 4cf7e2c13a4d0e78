#!/bin/bash
# One device call (the GPU machine's 16-core CPU, quiet) for the CPU engine's figures:
# `dsinfer check-env` where a GPU exists (issue 7), and `dsinfer bench-engine` on the
# embedded target + DSpark drafter with and without --dflash-enable-async-prefetch at
# several thread counts (issue 5: does overlapping drafting with verification pay where
# cores are free?). The binary is built on the dev machine and carried in build-dev/
# (with the Debian shared libraries the device image lacks in build-dev/lib):
#   mkdir -p build-dev/lib && cp build/dsinfer build-dev/ && strip build-dev/dsinfer
#   cp -L /lib/x86_64-linux-gnu/lib{pcre2-8.so.0,utf8proc.so.2,cpp-httplib.so.0.11,brotli{dec,enc,common}.so.1} build-dev/lib/
# Results (text + JSON) go to $OUT. CONFIGS lists threads:draft_threads pairs to run.
set -u
OUT=${OUT:-/tmp/dsinfer-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-dev/lib:${LD_LIBRARY_PATH:-}
B=$PWD/build-dev/dsinfer
{ date -u; nproc; lscpu | grep -E "Model name|Thread|Core|Socket|Flags" | cut -c1-200; free -g | head -2; } > "$OUT/machine.txt" 2>&1
"$B" check-env --verbose --model-path models/embedded/target > "$OUT/check_env.txt" 2>&1; echo "exit $?" >> "$OUT/check_env.txt"
"$B" check-env --json --model-path models/embedded/target > "$OUT/check_env.json" 2>> "$OUT/check_env.txt"
for cfg in ${CONFIGS:-1:1 4:4 8:8}; do
  t=${cfg%%:*}; d=${cfg##*:}
  timeout ${CELL_TIMEOUT:-170} "$B" bench-engine --model-path models/embedded/target --draft-model-path models/embedded/dspark \
    --prompts models/eval/heldout_code.jsonl --concurrency ${LEVELS:-1,4,16,64} \
    --policies ${POLICIES:-none,fixed,fixed+prefetch,dspark,dspark+prefetch} --max-tokens 64 --prompt-tokens 256 \
    --rounds-per-slot 1 --threads "$t" --async-draft-threads "$d" > "$OUT/bench_t${t}_d${d}.md" 2> "$OUT/bench_t${t}_d${d}.err"
  echo "threads $t draft $d exit $?"; cat "$OUT/bench_t${t}_d${d}.md"
done
