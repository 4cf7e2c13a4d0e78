#!/bin/bash
# One call on the GPU machine (the device tool), from the repository root, for the CUDA
# backend (docs/CUDA.md): prints the environment, runs the CUDA tests, measures the
# device-to-device copy bandwidth and the batch-1 decode of a random Qwen3-4B-shaped BF16
# checkpoint (made here with make-random-model, never shipped) with dsinfer and with
# PyTorch/transformers. Binaries are built on the dev machine and carried in
# build-cuda/dev (with the shared libraries the device image may lack in build-cuda/dev/lib),
# or packed as build-cuda/devpack/dev.tar.xz (tar -cJf, to fit the call's 64 MiB tree).
# Logs and JSON go to $OUT. STEPS (default "env tests bench hf"; also "profile": per-stage
# decode times with DSINFER_CUDA_PROFILE=1) picks what runs; BENCH_VARIANTS lists
# gemm:graphs[:pdl[:VAR=VALUE]] (gemm: invariant (tensor cores), rows (the row kernel) or cublas;
# default "invariant:on cublas:on invariant:off"; pdl is the
# DSINFER_CUDA_PDL value, default 1 as in the engine, 0 turns programmatic dependent launch off; VAR=VALUE[+VAR=VALUE...] is set for that run, e.g.
# DSINFER_CUDA_L2_PREFETCH=0). "stalls": Nsight Compute stall samples per instruction (below). "ncu": Nsight Compute kernel
# durations of one eager decode step at position NCU_PROMPT; "ncuab": kernel durations per
# NCU_VARIANTS environment (A/B of kernel variants, ncu_summary.py --by-kernel). VERIFY_BLOCKS (e.g. 1,2,4,8,16)
# adds bench-model --verify-blocks to every variant. "engine": bench-engine --device cuda on
# the same model with a random DSpark drafter (scripts/make_random_dspark.py, drafter on the
# CPU) in the synthetic-acceptance mode: ENGINE_POLICIES (default none,dspark) x
# ENGINE_CONCURRENCY (default 1,8,32,128,256) x ENGINE_ACCEPT (default 0.8; a list runs one
# grid per rate), ENGINE_TOKENS new tokens per request (default 64), ENGINE_PROMPT prompt
# tokens (default 64; 256 distinct random prompts); JSON per rate in $OUT/engine_*.json.
# ENGINE_CURVE (e.g. "0.5 0.7 0.9"): then none and dspark at concurrency 1 per rate (the
# tau-driven speedup at batch 1), $OUT/curve_*.json. ENGINE_PROFILE=1: then plain decoding
# at concurrency ENGINE_PROFILE_C (default 256) with DSINFER_CUDA_PROFILE=1 (eager, per-stage
# GPU times per forward), $OUT/engine_profile.txt. "serve": dsinfer serve --device cuda on the
# embedded target (with its DSpark drafter when the tree carries it: DRAFTERS=dspark for
# device_tree.sh), one greedy completion over HTTP, $OUT/serve.log. "sampling": bench-engine
# with sampled requests (temperature 0.8, top-p 0.9, plain decoding) on the same model with
# DSINFER_CUDA_SAMPLING=1 (sampling on the GPU) and 0 (logit rows to the host), concurrency
# SAMPLING_CONCURRENCY (default 1,8,64), $OUT/sampling_*.json. "grid": the issue-5 grid on
# the embedded models (scripts/device_engine_grid.sh: GRID_*, VARIANTS). "v4": DeepSeek-V4 on the
# GPU (below: V4_LAYERS, V4_EXPERTS, V4_PROMPT, V4_DECODE, V4_VERIFY). "shapes": batch-1 decode
# of other Qwen3 shapes per DSINFER_CUDA_PDL value (below: SHAPES, SHAPE_PDL). TESTS: the test binaries the
# "tests" step runs (default: all four). DECODE / PROMPT: bench-model's token counts.
set -u
R=$PWD
OUT=${OUT:-/tmp/dsinfer-out}
mkdir -p "$OUT"
DEV=$R/build-cuda/dev
# The binaries may travel packed (the device call's tree limit): unpack them first.
if [ -e "$R/build-cuda/devpack/dev.tar.xz" ]; then mkdir -p "$R/build-cuda" && tar -xJf "$R/build-cuda/devpack/dev.tar.xz" -C "$R/build-cuda"; fi
STEPS=${STEPS:-env tests bench hf}
CUB=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; [print(os.path.join(p, "cublas", "lib")) for p in nvidia.__path__]' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && CUB=$d && break
done
export LD_LIBRARY_PATH=$DEV/lib${CUB:+:$CUB}:${LD_LIBRARY_PATH:-}
# The test binaries have the dev machine's paths compiled in (DSINFER_TEST_DATA, DSINFER_BIN).
if [ "$R" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$R" /work/main; fi
cp "$DEV/dsinfer" "$R/build-cuda/dsinfer"
date -u | tee "$OUT/env.txt"

# The random 4B model takes minutes of CPU: start it first, in the background (a second run
# of this script in the same call reuses it).
MAKE_PID=""
if [[ " $STEPS " == *" bench "* || " $STEPS " == *" hf "* || " $STEPS " == *" profile "* || " $STEPS " == *" ncu "* || " $STEPS " == *" ncuab "* || " $STEPS " == *" stalls "* || " $STEPS " == *" engine "* || " $STEPS " == *" sampling "* ]] && [ ! -e /tmp/q4b/config.json ]; then
  ( "$DEV/dsinfer" make-random-model --like qwen3-4b --dtype bf16 --out /tmp/q4b > /tmp/make_model.log 2>&1 ) &
  MAKE_PID=$!
fi

# "v4": a random-weight DeepSeek-V4 checkpoint with Flash's per-layer shapes (hidden 4096, 64
# heads of 512, q/o LoRA 1024 in 8 groups, indexer 64 x 128 top-512, MoE inter 2048 top-6, FP8
# dense and FP4 experts) scaled to V4_LAYERS layers and V4_EXPERTS experts (Flash: 43, 256),
# made here (tools/reference/make_random_deepseek_v4.py --quant), then bench-model on the GPU
# with graphs on and off; JSON in $OUT/v4_*.json.
V4_DIR=/tmp/v4flash
if [[ " $STEPS " == *" v4 "* ]] && [ ! -e $V4_DIR/config.json ]; then
  ( python3 "$R/tools/reference/make_random_deepseek_v4.py" $V4_DIR --quant --vocab 129280 --hidden 4096 \
      --layers ${V4_LAYERS:-16} --heads 64 --head-dim 512 --q-lora 1024 --o-groups 8 --o-lora 1024 \
      --experts ${V4_EXPERTS:-64} --top-k 6 --moe-inter 2048 --index-heads 64 --index-head-dim 128 --index-topk 512 \
      > /tmp/make_v4.log 2>&1 ) &
  V4_PID=$!
fi

if [[ " $STEPS " == *" env "* ]]; then
  { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    "$DEV/dsinfer" check-env; echo "cublas dir: $CUB"; ldd "$DEV/dsinfer" | grep -E "not found|cublas|ssl|crypto"; nproc; } 2>&1 | tee -a "$OUT/env.txt"
fi
if [[ " $STEPS " == *" tests "* ]]; then
  for t in ${TESTS:-test_cuda_kernels test_cuda_model test_cuda_cli test_cuda_engine}; do
    timeout 300 "$DEV/$t" 2>&1 | tee -a "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |\[cuda|Failure|error|Expected|Which|actual" | tail -60
  done
fi
if [[ " $STEPS " == *" bench "* || " $STEPS " == *" hf "* || " $STEPS " == *" profile "* || " $STEPS " == *" ncu "* || " $STEPS " == *" ncuab "* || " $STEPS " == *" stalls "* || " $STEPS " == *" engine "* || " $STEPS " == *" sampling "* ]]; then
  wait $MAKE_PID; tail -2 /tmp/make_model.log | tee -a "$OUT/env.txt"; du -sh /tmp/q4b
fi
if [[ " $STEPS " == *" bench "* ]]; then
  for v in ${BENCH_VARIANTS:-invariant:on cublas:on invariant:off}; do
    IFS=: read -r g gr pdl extra <<< "$v"
    pdl=${pdl:-1}
    name=bench_4b_${g}_graphs_${gr}_pdl${pdl}${extra:+_$(echo "$extra" | tr -c 'A-Za-z0-9\n' _)}
    env ${extra//+/ } DSINFER_CUDA_PDL=$pdl timeout 240 "$DEV/dsinfer" bench-model --model-path /tmp/q4b --device cuda --cuda-gemm $g --cuda-graphs $gr \
      --prompt-tokens ${PROMPT:-32} --decode-tokens ${DECODE:-256} --repeat 3 ${VERIFY_BLOCKS:+--verify-blocks $VERIFY_BLOCKS} \
      --json > "$OUT/$name.json" 2>> "$OUT/bench.err"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], {k: j[k] for k in ['decode_tokens_per_s','decode_tokens_per_s_median','prefill_tokens_per_s','memory_bandwidth_gbs','weight_bytes_per_decode_token','roofline_decode_tokens_per_s','roofline_pct']}); print('  device', j['device']); [print('  verify', v) for v in j.get('verify_blocks', [])]" \
      "$OUT/$name.json" "$g/graphs-$gr/pdl-$pdl${extra:+/$extra}" || tail -5 "$OUT/bench.err"
  done
fi
# "shapes": batch-1 decode of other random Qwen3 shapes (SHAPES, default qwen3-0.6b
# qwen3-1.7b), graphs on, invariant GEMMs, once per DSINFER_CUDA_PDL value in SHAPE_PDL
# (default "0 1"): where programmatic dependent launch starts to pay or cost.
if [[ " $STEPS " == *" shapes "* ]]; then
  for like in ${SHAPES:-qwen3-0.6b qwen3-1.7b}; do
    [ -e /tmp/$like/config.json ] || "$DEV/dsinfer" make-random-model --like $like --dtype bf16 --out /tmp/$like > /tmp/make_$like.log 2>&1
    for pdl in ${SHAPE_PDL:-0 1}; do
      DSINFER_CUDA_PDL=$pdl timeout 200 "$DEV/dsinfer" bench-model --model-path /tmp/$like --device cuda --prompt-tokens ${PROMPT:-32} \
        --decode-tokens ${DECODE:-256} --repeat 3 --json > "$OUT/shape_${like}_pdl$pdl.json" 2>> "$OUT/bench.err"
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], {k: round(j[k], 2) for k in ['decode_tokens_per_s','decode_tokens_per_s_median','roofline_pct']}, j['device'].split('pdl ')[-1])" \
        "$OUT/shape_${like}_pdl$pdl.json" "$like pdl=$pdl" || tail -5 "$OUT/bench.err"
    done
  done
fi
if [[ " $STEPS " == *" v4 "* ]]; then
  [ -n "${V4_PID:-}" ] && wait $V4_PID
  tail -1 /tmp/make_v4.log | tee -a "$OUT/env.txt"; du -sh $V4_DIR
  for gr in on off; do
    timeout 300 "$DEV/dsinfer" bench-model --model-path $V4_DIR --device cuda --cuda-graphs $gr --prompt-tokens ${V4_PROMPT:-32} \
      --decode-tokens ${V4_DECODE:-128} --repeat 3 ${V4_VERIFY:+--verify-blocks $V4_VERIFY} --json > "$OUT/v4_graphs_$gr.json" 2>> "$OUT/v4.err"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('v4 graphs', sys.argv[2], {k: j[k] for k in ['decode_tokens_per_s','decode_tokens_per_s_median','prefill_tokens_per_s','memory_bandwidth_gbs','weight_bytes_per_decode_token','roofline_decode_tokens_per_s','roofline_pct']}); [print('  verify', v) for v in j.get('verify_blocks', [])]" \
      "$OUT/v4_graphs_$gr.json" $gr || tail -5 "$OUT/v4.err"
  done
  grep -m2 "deepseek_v4" "$OUT/v4.err"
  if [ "${V4_NCU:-0}" = 1 ]; then
    # Kernel time per decode token: three eager forwards of one row (a 1-token prompt, 2 more
    # tokens), every kernel timed by Nsight Compute, summed by kernel name and divided by 3.
    NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    timeout 400 "$NCU" --clock-control none --cache-control none --csv --metrics gpu__time_duration.sum \
      "$DEV/dsinfer" generate --model-path $V4_DIR --device cuda --cuda-graphs off --prompt-ids 5 --max-tokens 3 \
      > "$OUT/v4_ncu.csv" 2> "$OUT/v4_ncu.err"
    python3 - "$OUT/v4_ncu.csv" <<'PY'
import csv, re, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
tot, cnt = collections.Counter(), collections.Counter()
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum": continue
    v = float(r["Metric Value"].replace(",", "")); u = r.get("Metric Unit", "ns")
    us = v / 1e3 if u in ("ns", "nsecond") else v * 1e3 if u in ("ms", "msecond") else v
    n = re.sub(r"\(.*", "", r["Kernel Name"].replace("(anonymous namespace)::", "").replace("dsinfer::cuda::", "")).replace("void ", "")
    tot[n] += us; cnt[n] += 1
print("v4 ncu: %.1f us per token in %d kernels" % (sum(tot.values()) / 3, sum(cnt.values()) // 3))
for n, us in tot.most_common(25): print("  %-70s %5d launches/token %9.1f us/token" % (n[:70], cnt[n] // 3, us / 3))
PY
  fi
fi
if [[ " $STEPS " == *" profile "* ]]; then
  # Per-stage decode times (eager, CUDA events between stages): where a token's time goes.
  for g in invariant cublas; do
    echo "== $g" >> "$OUT/profile.txt"
    DSINFER_CUDA_PROFILE=1 DSINFER_CUDA_PDL=0 timeout 120 "$DEV/dsinfer" bench-model --model-path /tmp/q4b --device cuda --cuda-gemm $g \
      --prompt-tokens ${PROMPT:-32} --decode-tokens 64 --repeat 1 >> "$OUT/profile.txt" 2>&1
  done
  grep -E "==|forwards|us/forward" "$OUT/profile.txt"
fi
if [[ " $STEPS " == *" ncu "* ]]; then
  # Kernel durations of one eager decode step (graphs and PDL off) at position NCU_PROMPT,
  # from Nsight Compute: forwards 1-2 are bench-model's warm-up, 3 the prefill, 4 the
  # first decode step (219 kernels each for the 36-layer model).
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  DSINFER_CUDA_PDL=0 timeout 300 "$NCU" --clock-control none --cache-control none --csv \
    --metrics gpu__time_duration.sum -s 657 -c 219 "$DEV/dsinfer" bench-model --model-path /tmp/q4b --device cuda \
    --cuda-graphs off --prompt-tokens ${NCU_PROMPT:-256} --decode-tokens 2 --repeat 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  echo "== ncu"; python3 "$R/scripts/ncu_summary.py" "$OUT/ncu.csv" || tail -5 "$OUT/ncu.err"
fi
if [[ " $STEPS " == *" ncuab "* ]]; then
  # Kernel durations per variant (NCU_VARIANTS: space-separated VAR=VALUE[+VAR=VALUE], "-" for
  # none) over an eager run (prompt NCU_PROMPT, 4 decode steps), kernels matching NCU_KERNELS,
  # grouped by kernel and grid (scripts/ncu_summary.py --by-kernel): for A/B runs of kernel variants.
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  i=0
  for v in ${NCU_VARIANTS:--}; do
    i=$((i + 1))
    envs=(); [ "$v" != - ] && IFS=+ read -ra envs <<< "$v"
    env "${envs[@]}" DSINFER_CUDA_PDL=0 timeout 200 "$NCU" --clock-control none --cache-control none --csv \
      --metrics gpu__time_duration.sum -k "regex:${NCU_KERNELS:-attention|gemm_rows}" "$DEV/dsinfer" bench-model \
      --model-path /tmp/q4b --device cuda --cuda-graphs off --prompt-tokens ${NCU_PROMPT:-256} --decode-tokens 4 \
      --repeat 1 > "$OUT/ncuab_$i.csv" 2> "$OUT/ncuab_$i.err"
    echo "== ncu $v"; python3 "$R/scripts/ncu_summary.py" --by-kernel "$OUT/ncuab_$i.csv" 12 || tail -5 "$OUT/ncuab_$i.err"
  done
fi
if [[ " $STEPS " == *" stalls "* ]]; then
  # Why a kernel's warps wait: Nsight Compute's full set (warp states, scheduler, instruction
  # and memory sections, per-instruction stall samples every 32 cycles) over STALL_COUNT
  # eager launches of the kernels matching each regex in STALL_KERNELS, after STALL_SKIP[i]
  # matching launches (past the warm-up and the prompt); the report pages land in
  # $OUT/stalls_<i>_{details,source}.csv and the SASS of the dsinfer binary in $OUT/dsinfer.sass;
  # scripts/ncu_stalls.py prints each launch's stall shares and its STALL_TOP busiest instructions.
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null | head -1)
  [ -n "$CUOBJDUMP" ] && "$CUOBJDUMP" -sass "$DEV/dsinfer" > "$OUT/dsinfer.sass" 2>/dev/null
  read -ra skips <<< "${STALL_SKIP:-40 1000}"
  i=0
  for k in ${STALL_KERNELS:-attention_fold_qk gemm_rows}; do
    DSINFER_CUDA_PDL=0 timeout 300 "$NCU" --set full --import-source no --warp-sampling-interval 0 --clock-control none \
      -k "regex:$k" -s ${skips[$i]:-40} -c ${STALL_COUNT:-5} -o /tmp/stalls_$i -f "$DEV/dsinfer" bench-model --model-path /tmp/q4b \
      --device cuda --cuda-gemm ${STALL_GEMM:-rows} --cuda-graphs off --prompt-tokens ${NCU_PROMPT:-128} --decode-tokens 16 --repeat 1 \
      > "$OUT/stalls_$i.log" 2>&1
    "$NCU" -i /tmp/stalls_$i.ncu-rep --page details --csv > "$OUT/stalls_${i}_details.csv" 2>> "$OUT/stalls_$i.log"
    "$NCU" -i /tmp/stalls_$i.ncu-rep --page source --csv --print-source sass > "$OUT/stalls_${i}_source.csv" 2>> "$OUT/stalls_$i.log"
    echo "== stalls $k"
    python3 "$R/scripts/ncu_stalls.py" "$OUT/stalls_${i}_source.csv" --top ${STALL_TOP:-12} || tail -5 "$OUT/stalls_$i.log"
    i=$((i + 1))
  done
fi
if [[ " $STEPS " == *" engine "* ]]; then
  # Random DSpark drafter for the 4B shape, and random prompt ids (no tokenizer in /tmp/q4b).
  python3 "$R/scripts/make_random_dspark.py" /tmp/q4b /tmp/q4b-dspark ${ENGINE_DRAFT_BLOCK:+--block-size $ENGINE_DRAFT_BLOCK} | tee -a "$OUT/env.txt"
  python3 -c "
import json, random
r = random.Random(1)
for i in range(256): print(json.dumps({'prompt_ids': [r.randrange(151000) for _ in range(${ENGINE_PROMPT:-64})]}))" > /tmp/q4b_prompts.jsonl
  for p in ${ENGINE_ACCEPT:-0.8}; do
    timeout ${ENGINE_TIMEOUT:-400} "$DEV/dsinfer" bench-engine --model-path /tmp/q4b --draft-model-path /tmp/q4b-dspark --device cuda \
      --prompts /tmp/q4b_prompts.jsonl --prompt-tokens ${ENGINE_PROMPT:-64} --max-tokens ${ENGINE_TOKENS:-64} --rounds-per-slot 1 \
      --policies ${ENGINE_POLICIES:-none,dspark} --concurrency ${ENGINE_CONCURRENCY:-1,8,32,128,256} \
      --synthetic-acceptance-rate $p ${ENGINE_ARGS:-} --json > "$OUT/engine_$p.json" 2> "$OUT/engine_$p.err"
    echo "== bench-engine, synthetic acceptance $p (rc $?)"; grep -E "bench-engine|C=" "$OUT/engine_$p.err" | tail -20
  done
  for p in ${ENGINE_CURVE:-}; do
    timeout 120 "$DEV/dsinfer" bench-engine --model-path /tmp/q4b --draft-model-path /tmp/q4b-dspark --device cuda \
      --prompts /tmp/q4b_prompts.jsonl --prompt-tokens ${ENGINE_PROMPT:-64} --max-tokens ${ENGINE_TOKENS:-64} --rounds-per-slot 1 \
      --policies none,dspark --concurrency 1 --synthetic-acceptance-rate $p ${ENGINE_ARGS:-} --json > "$OUT/curve_$p.json" 2> "$OUT/curve_$p.err"
    echo "== batch 1, synthetic acceptance $p (rc $?)"; grep -E "C=" "$OUT/curve_$p.err" | tail -2
  done
  if [ "${ENGINE_PROFILE:-0}" = 1 ]; then
    DSINFER_CUDA_PROFILE=1 timeout 120 "$DEV/dsinfer" bench-engine --model-path /tmp/q4b --device cuda \
      --prompts /tmp/q4b_prompts.jsonl --prompt-tokens ${ENGINE_PROMPT:-64} --max-tokens ${ENGINE_TOKENS:-64} --rounds-per-slot 1 \
      --policies none --concurrency ${ENGINE_PROFILE_C:-256} ${ENGINE_ARGS:-} > "$OUT/engine_profile.txt" 2>&1
    echo "== engine profile (rc $?)"; grep -E "C=|forwards|us/forward" "$OUT/engine_profile.txt" | head -40
  fi
fi
if [[ " $STEPS " == *" sampling "* ]]; then
  # Sampled plain decoding through the engine (temperature 0.8, top-p 0.9): verification and
  # sampling on the GPU (ids back) against DSINFER_CUDA_SAMPLING=0 (logit rows to the host).
  python3 -c "
import json, random
r = random.Random(1)
for i in range(256): print(json.dumps({'prompt_ids': [r.randrange(151000) for _ in range(64)]}))" > /tmp/q4b_prompts.jsonl
  for sm in 1 0; do
    DSINFER_CUDA_SAMPLING=$sm timeout 200 "$DEV/dsinfer" bench-engine --model-path /tmp/q4b --device cuda --prompts /tmp/q4b_prompts.jsonl \
      --prompt-tokens 64 --max-tokens ${SAMPLING_TOKENS:-64} --rounds-per-slot 1 --policies none --concurrency ${SAMPLING_CONCURRENCY:-1,8,64} \
      --temperature 0.8 --top-p 0.9 ${ENGINE_ARGS:-} --json > "$OUT/sampling_$sm.json" 2> "$OUT/sampling_$sm.err"
    echo "== sampled engine, DSINFER_CUDA_SAMPLING=$sm (rc $?)"; grep -E "C=" "$OUT/sampling_$sm.err" | tail -6
  done
fi
if [[ " $STEPS " == *" serve "* ]]; then
  SPEC="--spec none"; [ -e "$R/models/embedded/dspark/model.safetensors" ] && SPEC="--draft-model-path $R/models/embedded/dspark"
  "$DEV/dsinfer" serve --model-path "$R/models/embedded/target" $SPEC --device cuda --port 18080 > "$OUT/serve.log" 2>&1 &
  SERVE_PID=$!
  python3 - <<'PY' 2>&1 | tee "$OUT/serve_completion.txt"
import json, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen("http://127.0.0.1:18080/health", timeout=2); break
    except Exception:
        time.sleep(1)
req = urllib.request.Request("http://127.0.0.1:18080/v1/completions", method="POST",
                             data=json.dumps({"prompt": "int main(", "max_tokens": 32, "temperature": 0}).encode(),
                             headers={"Content-Type": "application/json"})
print(json.loads(urllib.request.urlopen(req, timeout=60).read()))
PY
  kill $SERVE_PID; wait $SERVE_PID; echo "== serve (rc $?)"; tail -5 "$OUT/serve.log"
fi
if [[ " $STEPS " == *" grid "* ]]; then
  bash "$R/scripts/device_engine_grid.sh"
fi
if [[ " $STEPS " == *" hf "* ]]; then
  PYTHONUNBUFFERED=1 timeout 300 python3 "$R/scripts/hf_generate_bench.py" /tmp/q4b ${PROMPT:-32} ${HF_DECODE:-128} > "$OUT/hf_4b.json" 2> "$OUT/hf_4b.err"
  cat "$OUT/hf_4b.json"; tail -3 "$OUT/hf_4b.err"
fi
date -u
