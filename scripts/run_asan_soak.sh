#!/usr/bin/env bash
# Builds ONE test executable, test_engine_paged_soak (the batched engine on the paged KV
# pool: 200 requests, cancellations, preemption, pool invariants), with AddressSanitizer +
# UBSan (-DDSINFER_SANITIZE=ON) in build-asan-soak/. -O1 without debug info: the cheapest
# build that still checks every access. ctest then runs it as asan.engine_paged_soak
# (tests/cmake/asan_soak.cmake; skipped when this build is absent).
#   bash scripts/run_asan_soak.sh          build it
#   bash scripts/run_asan_soak.sh --run    build it and run it now
# Cost: it compiles the core..engine floors again with ASan (most of the tree's objects),
# which is why scripts/run_tests.sh does it only with DSINFER_ASAN_SOAK=1.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan-soak -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS=-O1 -DDSINFER_SANITIZE=ON >/dev/null
cmake --build build-asan-soak -j "${JOBS:-$(nproc)}" --target test_engine_paged_soak
if [[ "${1:-}" == "--run" ]]; then
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 exec build-asan-soak/tests/test_engine_paged_soak
fi
