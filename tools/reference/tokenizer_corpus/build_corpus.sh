#!/usr/bin/env bash
# Builds the mixed-text tokenizer conformance corpus, tests/data/tokenizer_corpus/*.txt
# (~2.5 MB, committed), from text that Debian 12 packages ship, plus deterministically
# generated Unicode stress text. Each output file is one "text" (a 1-8 KB chunk) that
# tools/reference/tokenizer_goldens.py encodes with Hugging Face `tokenizers`; the C++
# conformance test then replays the resulting goldens.
#
# Data flow: fixed list of source files (skipped with a note when absent) -> per-category
# text stream -> chunks cut at line boundaries with sizes from a seeded RNG -> files named
# <category>_<NNNN>.txt. Re-running on the same package versions gives identical output;
# the committed files are the reference, so re-running is only needed to refresh them.
# Sources and licences are listed in tests/data/tokenizer_corpus/README.md.
#
# Usage: tools/reference/tokenizer_corpus/build_corpus.sh [OUT_DIR]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
out="${1:-$root/tests/data/tokenizer_corpus}"
# Debian's python3 (not a pyenv shim) so the RNG and gzip/gettext modules are the distro's.
py=/usr/bin/python3
[[ -x $py ]] || py=python3
exec "$py" "$here/build_corpus.py" "$out"
