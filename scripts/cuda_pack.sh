#!/bin/bash
# Packs what one device call runs (scripts/cuda_device_run.sh): the stripped dsinfer and CUDA
# test binaries of build-cuda, with the Debian shared libraries the device image lacks
# (pcre2, utf8proc, cpp-httplib, brotli), into build-cuda/devpack/dev.tar.xz (name
# build-cuda/devpack in the call's carry). Run from the repository root after
#   ninja -C build-cuda dsinfer tests/test_cuda_kernels tests/test_cuda_model tests/test_cuda_cli tests/test_cuda_engine tests/test_cuda_v4
set -euo pipefail
B=build-cuda
rm -rf "$B/dev" "$B/devpack"
mkdir -p "$B/dev/lib" "$B/devpack"
for b in dsinfer tests/test_cuda_kernels tests/test_cuda_model tests/test_cuda_cli tests/test_cuda_engine tests/test_cuda_v4; do
  [ -e "$B/$b" ] || { echo "missing $B/$b" >&2; exit 1; }
  strip -o "$B/dev/$(basename "$b")" "$B/$b"
done
for lib in $(ldd "$B/dsinfer" "$B/tests/test_cuda_cli" | awk '/=> \// {print $3}' | sort -u | grep -E "pcre2|utf8proc|httplib|brotli"); do
  cp -L "$lib" "$B/dev/lib/"
done
# -9e: a 64 MiB dictionary spans the binaries, which share most of their code (17 MB -> 6 MB).
XZ_OPT="-9e -T2" tar -cJf "$B/devpack/dev.tar.xz" -C "$B" dev
ls -la "$B/devpack/dev.tar.xz" "$B/dev" "$B/dev/lib"
