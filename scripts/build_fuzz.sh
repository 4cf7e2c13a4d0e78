#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.cpp) with clang, ASan and UBSan in build-fuzz/,
# and in the same instrumented build the paged-KV engine soak test (test_engine_paged_soak:
# 200 requests, cancellations, preemption, every block back), which ctest runs as
# asan.engine_paged_soak (tests/cmake/asan_soak.cmake): the leak check under ASan in CI.
# ctest runs the fuzzers (tests/cmake/fuzz.cmake) for a bounded time each.
set -euo pipefail
cd "$(dirname "$0")/.."
ls fuzz/fuzz_*.cpp >/dev/null 2>&1 || exit 0
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSINFER_FUZZ=ON \
  -DDSINFER_BUILD_TESTS=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
targets=$(for s in fuzz/fuzz_*.cpp; do basename "$s" .cpp; done)
cmake --build build-fuzz -j "${JOBS:-$(nproc)}" --target $targets test_engine_paged_soak
