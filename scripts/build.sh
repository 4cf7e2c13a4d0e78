#!/usr/bin/env bash
# Configures and builds dsinfer (Release) in build/. Extra args go to cmake configure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_deps.sh
JOBS=${JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$JOBS"
