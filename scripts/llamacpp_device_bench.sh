#!/bin/bash
# llama.cpp's CUDA build against dsinfer on the same H200, in one device call (issue 8;
# results: docs/PERFORMANCE.md, "llama.cpp CUDA on the same H200"). Batch-1 decode and prompt
# processing of one random-weight BF16 checkpoint with Qwen3-4B's shape
# (`dsinfer make-random-model --like qwen3-4b --dtype bf16`, made on the device, never
# shipped), read by dsinfer's bench-model from the safetensors and by llama.cpp's llama-bench
# from a GGUF written from the same safetensors (tools/bench/qwen3_random_to_gguf.py: same
# weights bit for bit, "no vocab" tokenizer).
#
# STATUS: ran on the H200 on 2026-12-02 at 16:55 UTC (session 10) with the prebuilt
# llama-bench (build info de3ff81 (1), MMQ-trimmed as below), DSINFER_RUNS="invariant:32
# cublas:32" CALL_LIMIT=270: 143 s in all; results in docs/PERFORMANCE.md, "llama.cpp CUDA on
# the same H200". The build-on-the-device fallback path has never run.
#
# Two modes:
#   bash scripts/llamacpp_device_bench.sh pack   (dev machine) packs into .llama/ (ignored:
#       add /.llama/ to .git/info/exclude):
#       .llama/llama-bench.tar.xz  llama-bench from LLAMA_BUILD (default /tmp/llb/build, a build
#                                  of LLAMA_SRC, default /work/llamacpp) with the libgomp and
#                                  libcudart it links, plus LLAMA_SRC's gguf-py;
#       .llama/llama-src.tar.xz    a trimmed LLAMA_SRC (no .git, models, docs, examples, tests,
#                                  other backends), used on the device only when
#                                  .llama/llama-bench.tar.xz is absent: it is then built there
#                                  (~4-6 minutes of the call's 16 cores, estimated, not timed),
#                                  with the MMQ trim below.
#     The dev-machine build that was carried (2 cores, ~40 min niced; session 10):
#       C=$LLAMA_SRC/ggml/src/ggml-cuda    # the MMQ trim, as the device build below does it:
#       sed -i -E 's/mul_mat_q_case<(GGML_TYPE_[A-Z0-9_]+)>\(ctx, args, stream\);/GGML_ABORT("...", ggml_type_name(\1));/' $C/mmq.cu
#       for f in $C/template-instances/mmq-instance-*.cu; do echo "// trimmed" > $f; done
#       cmake -S $LLAMA_SRC -B /tmp/llb/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON
#         -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
#         -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
#         -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DGGML_CUDA_NCCL=OFF
#         -DGGML_CUDA_FA_QUANTS=bf16-bf16
#       nice -n 19 ninja -C /tmp/llb/build llama-bench ; git -C $LLAMA_SRC checkout -- ggml/src/ggml-cuda
#     What is off, and why it does not touch this benchmark: MMQ (the quantized-weight matrix
#     kernels: 22 of the slowest files; a BF16 model never reaches them, since
#     ggml_cuda_should_use_mmq is false for unquantized types, and mmq.cu now aborts loudly if
#     it ever did); the flash-attention vector kernels for q4_0/q8_0 K/V (FA_QUANTS: F16 and
#     BF16 K/V stay; llama-bench's K/V cache is F16); NCCL (one GPU); PTX (90-real: sm_90 SASS
#     only). FlashAttention (tile, MMA, vector), MMF/MMVF, cuBLAS and CUDA graphs (on by
#     default in llama.cpp builds) are built as upstream builds them.
#   bash scripts/llamacpp_device_bench.sh        (the device call, repository root), e.g.
#       OWNER=llama DRAFTERS="" EXTRA="tests/data/tokenizer_goldens tools/train/prompts.npz tests/data/deepseek_v4" \
#         bash scripts/device_tree.sh take
#       run(command="CALL_LIMIT=480 bash scripts/llamacpp_device_bench.sh", carry=[".llama", "build-cuda/devpack"], timeout_s=500)
#       bash scripts/device_tree.sh give
#     (with llama-bench.tar.xz carried, leave llama-src.tar.xz out of .llama: tree + carry
#     must stay under 64 MiB.) Needs build-cuda/devpack/dev.tar.xz (scripts/cuda_pack.sh) and
#     .llama/. Logs and JSON in $OUT: steps.log, env.txt, bench_*.json (dsinfer),
#     llama_bench.json, summary.txt. LLAMA_ARGS replaces llama-bench's arguments after -m
#     (default below); DSINFER_RUNS lists gemm:prompt_tokens (default "invariant:32 cublas:32
#     cublas:512"); CALL_LIMIT (s, default 585) bounds llama-bench's timeout.
set -u -o pipefail
R=$PWD
L=$R/.llama

if [ "${1:-}" = pack ]; then
  set -e
  SRC=${LLAMA_SRC:-/work/llamacpp}
  B=${LLAMA_BUILD:-/tmp/llb/build}
  mkdir -p "$L"
  rm -rf /tmp/llama-pack && mkdir -p /tmp/llama-pack/bin /tmp/llama-pack/lib
  if [ -x "$B/bin/llama-bench" ]; then
    strip -o /tmp/llama-pack/bin/llama-bench "$B/bin/llama-bench"
    for lib in $(ldd "$B/bin/llama-bench" | awk '/=> \// {print $3}' | grep -E "libgomp|libcudart"); do cp -L "$lib" /tmp/llama-pack/lib/; done
    cp -r "$SRC/gguf-py" /tmp/llama-pack/gguf-py
    git -C "$SRC" rev-parse HEAD > /tmp/llama-pack/COMMIT 2>/dev/null || true
    tar -cJf "$L/llama-bench.tar.xz" -C /tmp/llama-pack .
  else
    echo "no $B/bin/llama-bench: only the source is packed (the device call builds it)" >&2
    rm -f "$L/llama-bench.tar.xz"
  fi
  tar -cJf "$L/llama-src.tar.xz" -C "$SRC" --exclude=./.git --exclude=./models --exclude=./docs \
    --exclude=./examples --exclude=./tests --exclude=./benches --exclude=./media --exclude=./tools/ui \
    --exclude=./tools/server/public --exclude=./skills --exclude=./.github \
    $(for b in vulkan sycl opencl hexagon metal et webgpu openvino cann; do echo --exclude=./ggml/src/ggml-$b; done) .
  ls -la "$L"
  exit 0
fi

OUT=${OUT:-/tmp/llamacpp-out}
mkdir -p "$OUT"
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/steps.log"; }

# dsinfer's prebuilt CUDA binaries (scripts/cuda_pack.sh), as scripts/cuda_device_run.sh uses them.
tar -xJf "$R/build-cuda/devpack/dev.tar.xz" -C "$R/build-cuda" || { log "no devpack"; exit 1; }
DEV=$R/build-cuda/dev
CUB=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; [print(os.path.join(p, "cublas", "lib")) for p in nvidia.__path__]' 2>/dev/null); do
  [ -e "$d/libcublasLt.so.13" ] && CUB=$d && break
done
export LD_LIBRARY_PATH=$DEV/lib${CUB:+:$CUB}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}

# The random 4B checkpoint: minutes of CPU, so first and in the background.
( timeout 400 "$DEV/dsinfer" make-random-model --like qwen3-4b --dtype bf16 --out /tmp/q4b > "$OUT/make_model.log" 2>&1 ) &
MAKE_PID=$!
log "make-random-model started"

# llama.cpp: the prebuilt llama-bench, else build it here (background, niced, all cores).
# The device build trims MMQ (the matrix kernels of quantized weight types, the slowest files
# to compile): its template instances are emptied and mmq.cu aborts for those types instead.
# A BF16 model never reaches MMQ (ggml_cuda_should_use_mmq is false for unquantized types),
# so this changes no kernel this benchmark runs; FlashAttention, MMF/MMVF, cuBLAS and CUDA
# graphs are built as upstream builds them.
LB=/tmp/llama
mkdir -p $LB
BUILD_PID=""
if [ -e "$L/llama-bench.tar.xz" ]; then
  tar -xJf "$L/llama-bench.tar.xz" -C $LB
  log "prebuilt llama-bench unpacked ($(cat $LB/COMMIT 2>/dev/null))"
else
  mkdir -p $LB/src && tar -xJf "$L/llama-src.tar.xz" -C $LB/src
  cp -r $LB/src/gguf-py $LB/gguf-py
  C=$LB/src/ggml/src/ggml-cuda
  sed -i -E 's/mul_mat_q_case<(GGML_TYPE_[A-Z0-9_]+)>\(ctx, args, stream\);/GGML_ABORT("MMQ kernels for %s not built (bench build: quantized types trimmed)", ggml_type_name(\1));/' $C/mmq.cu
  for f in $C/template-instances/mmq-instance-*.cu; do echo "// trimmed: MMQ (quantized types) not instantiated in this BF16 bench build" > "$f"; done
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  ( cd $LB/src && timeout 120 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_COMPILER=$NVCC -DCMAKE_CUDA_ARCHITECTURES=90-real -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_APP=OFF -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA_QUANTS=bf16-bf16 \
      -DLLAMA_BUILD_NUMBER=1 -DLLAMA_BUILD_COMMIT=de3ff81-mmqtrim \
      && timeout ${BUILD_TIMEOUT:-420} nice -n 10 ninja -C build -j $(nproc) llama-bench \
      && mkdir -p $LB/bin && cp build/bin/llama-bench $LB/bin/ ) > "$OUT/llama_build.log" 2>&1 &
  BUILD_PID=$!
  log "building llama-bench here ($(nproc) jobs)"
fi
export LLAMA_LD=$LB/lib:${LD_LIBRARY_PATH}

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,clocks.max.sm --format=csv
  nvcc --version 2>/dev/null | tail -2; nproc; echo "cublas dir: $CUB"; "$DEV/dsinfer" check-env
  LD_LIBRARY_PATH=$LLAMA_LD ldd $LB/bin/llama-bench 2>/dev/null | grep -E "not found|cud|cublas|gomp"; } > "$OUT/env.txt" 2>&1

wait $MAKE_PID; log "make-random-model rc $? ($(tail -1 "$OUT/make_model.log"))"
[ -e /tmp/q4b/config.json ] || { log "no model"; exit 1; }
timeout 200 python3 "$R/tools/bench/qwen3_random_to_gguf.py" /tmp/q4b /tmp/q4b.gguf --gguf-py $LB/gguf-py 2>&1 | tee -a "$OUT/steps.log"
log "gguf rc $? ($(ls -la /tmp/q4b.gguf 2>&1))"

# dsinfer, batch-1 decode after a prompt (bench-model: best of 3, JSON).
for v in ${DSINFER_RUNS:-invariant:32 cublas:32 cublas:512}; do
  IFS=: read -r g p <<< "$v"
  timeout 150 "$DEV/dsinfer" bench-model --model-path /tmp/q4b --device cuda --cuda-gemm $g --cuda-graphs on \
    --prompt-tokens $p --decode-tokens 256 --repeat 3 --json > "$OUT/bench_${g}_p$p.json" 2>> "$OUT/bench.err"
  log "dsinfer $g prompt $p rc $?"
done

if [ -n "$BUILD_PID" ]; then wait $BUILD_PID; log "llama-bench build rc $? ($(tail -1 "$OUT/llama_build.log"))"; fi
ARGS=${LLAMA_ARGS:--ngl 99 -p 512 -n 256 -d 0,32 -r 3 -fa 0,1}
LEFT=$(( ${CALL_LIMIT:-585} - ($(date +%s) - T0) )); [ $LEFT -lt 30 ] && LEFT=30
LD_LIBRARY_PATH=$LLAMA_LD timeout $LEFT $LB/bin/llama-bench -m /tmp/q4b.gguf $ARGS -o json > "$OUT/llama_bench.json" 2> "$OUT/llama_bench.err"
log "llama-bench rc $? (llama-bench -m /tmp/q4b.gguf $ARGS -o json)"
tail -5 "$OUT/llama_bench.err"
# The dsinfer runs above overlapped the llama.cpp build (niced) when it was built here: the
# first one again on a quiet machine, if time is left.
if [ -n "$BUILD_PID" ] && [ $(( $(date +%s) - T0 )) -lt ${QUIET_BEFORE:-480} ]; then
  timeout 90 "$DEV/dsinfer" bench-model --model-path /tmp/q4b --device cuda --cuda-gemm invariant --cuda-graphs on \
    --prompt-tokens 32 --decode-tokens 256 --repeat 3 --json > "$OUT/bench_quiet_invariant_p32.json" 2>> "$OUT/bench.err"
  log "dsinfer invariant prompt 32 (quiet) rc $?"
fi

python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/summary.txt"
import json, os, sys, glob
out = sys.argv[1]
for f in sorted(glob.glob(os.path.join(out, "bench_*.json"))):
    try:
        j = json.load(open(f))
        print(os.path.basename(f), {k: j.get(k) for k in ["decode_tokens_per_s", "decode_tokens_per_s_median", "prefill_tokens_per_s",
              "memory_bandwidth_gbs", "weight_bytes_per_decode_token", "roofline_decode_tokens_per_s", "roofline_pct"]})
    except Exception as e:
        print(os.path.basename(f), "unreadable:", e)
try:
    rows = json.load(open(os.path.join(out, "llama_bench.json")))
    r0 = rows[0]
    print("llama.cpp", r0.get("build_commit"), r0.get("build_number"), "|", r0.get("gpu_info"), "|", r0.get("backends"),
          "| model", r0.get("model_type"), r0.get("model_size"), "bytes", r0.get("model_n_params"), "params")
    for r in rows:
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        print(f"  {test} @ d{r.get('n_depth', 0)} fa={r.get('flash_attn')} kv={r.get('type_k')}/{r.get('type_v')} "
              f"ub={r.get('n_ubatch')}: {r['avg_ts']:.2f} ± {r.get('stddev_ts', 0.0):.2f} tokens/s (samples {[round(x, 2) for x in r.get('samples_ts', [])]})")
except Exception as e:
    print("llama-bench json unreadable:", e)
PY
log "done"
