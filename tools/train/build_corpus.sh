#!/usr/bin/env bash
# Builds the training corpus from text that Debian 12 packages ship (issue 4, step 1).
#
#   tools/train/build_corpus.sh [WORK_DIR]        (default /work/corpus; never inside the repo)
#
# 1. apt-get download the pinned packages (versions as the archive has them now; the versions
#    actually used are recorded in tools/train/corpus_manifest.json with each .deb's sha256).
# 2. dpkg-deb -x them (no installation), untar the source tarballs they carry (C/C++/texinfo/
#    rst members only).
# 3. tools/train/corpus_select.py: filter, dedupe, cap, split train/held-out by file hash, write
#    WORK/out/corpus/{train,heldout}/<domain>.jsonl and models/eval/heldout_*.jsonl.
# 4. tar + xz the corpus into WORK/out/corpus.tar.xz and copy it to REPO/train-data/ (git-ignored,
#    what `run` carries to the GPU machine), write the manifest.
# Runs niced; about 10 minutes on one core (the linux tarball dominates).
set -euo pipefail
WORK=${1:-/work/corpus}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PKGS="linux-source-6.12 gcc-12-source libpython3.11-stdlib libpython3.11-minimal libpython3.11-testsuite python3.11-doc"
NICE="nice -n 10"
mkdir -p "$WORK/debs" "$WORK/pkgs" "$WORK/src" "$WORK/out"

cd "$WORK/debs"
for p in $PKGS; do
  ls ${p}_*.deb >/dev/null 2>&1 || $NICE apt-get download "$p"
done
for d in "$WORK"/debs/*.deb; do
  n=$(basename "$d"); n=${n%%_*}
  [ -d "$WORK/pkgs/$n" ] || $NICE dpkg-deb -x "$d" "$WORK/pkgs/$n"
done
cd "$WORK/src"
[ -d linux-source-6.12 ] || $NICE tar xJf "$WORK/pkgs/linux-source-6.12/usr/src/linux-source-6.12.tar.xz" \
  --wildcards '*.c' '*.h' '*.rst' '*/Documentation/*.txt'
[ -d gcc-12.2.0 ] || $NICE tar xJf "$WORK/pkgs/gcc-12-source/usr/src/gcc-12/gcc-12.2.0-dfsg.tar.xz" \
  --wildcards '*.c' '*.cc' '*.h' '*.texi'

rm -rf "$WORK/out/corpus"
$NICE python3 "$REPO/tools/train/corpus_select.py" --work "$WORK" --repo "$REPO"

cd "$WORK/out"
# Fixed member order and metadata so the archive is byte-reproducible.
$NICE tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2024-01-01 -cf - corpus \
  | $NICE xz -6 -T1 > corpus.tar.xz.tmp
mv corpus.tar.xz.tmp corpus.tar.xz
mkdir -p "$REPO/train-data"
cp corpus.tar.xz "$REPO/train-data/corpus.tar.xz"
$NICE python3 "$REPO/tools/train/corpus_manifest.py" --work "$WORK" --repo "$REPO" --packages $PKGS
ls -la "$WORK/out/corpus.tar.xz"
