#!/usr/bin/env bash
# Runs one libFuzzer target from build-fuzz/ for FUZZ_SECONDS (default 30) seconds over
# fuzz/corpus/<name>/ (seeds, read-only) and a scratch corpus. Exit 77 = not built.
set -uo pipefail
cd "$(dirname "$0")/.."
name=$1; secs=${FUZZ_SECONDS:-30}
bin=build-fuzz/fuzz/$name
[[ -x $bin ]] || { echo "fuzz: $bin not built (run scripts/build_fuzz.sh)"; exit 77; }
work=build-fuzz/corpus-$name; mkdir -p "$work"
args=("$work"); [[ -d fuzz/corpus/$name ]] && args+=("fuzz/corpus/$name")
"$bin" -max_total_time="$secs" -rss_limit_mb=4096 -timeout=10 "${args[@]}" > "build-fuzz/$name.log" 2>&1
rc=$?
tail -5 "build-fuzz/$name.log"
exit $rc
