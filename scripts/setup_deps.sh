#!/usr/bin/env bash
# Installs the Debian 12 packages dsinfer builds and tests with, only when missing.
# Called by scripts/run_demo.sh and scripts/run_tests.sh; safe to run repeatedly.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config ccache
      nlohmann-json3-dev libpcre2-dev libcli11-dev libgtest-dev zlib1g-dev libutf8proc-dev
      clang libclang-rt-14-dev libcpp-httplib-dev prometheus)
# Node.js (for npm-fetched test data) may come from Debian or NodeSource: check commands.
command -v node >/dev/null || PKGS+=(nodejs)
command -v npm >/dev/null || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup_deps: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
