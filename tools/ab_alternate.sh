#!/usr/bin/env bash
# A/B of a change on the GPU machine, in one device call, the two builds
# timed alternately: build the tree as it is ("base"), then with PATCH
# applied ("patched"; git apply, reversed afterwards), keep each build's
# modules, then ROUNDS times run the benchmark command on base, then on
# patched, swapping the modules in (base1, patched1, base2, ...: a drift of
# the machine shows as a difference between rounds, not between the two
# builds). Each run appends `--json $OUT/NAME.json`; the side-by-side table
# of benchmarks/matrix_compare.py follows. The records' kernel-sources
# digests name the tree on disk (the base) for both builds. Logs in
# $OUT/NAME.log. (AB_BUILD: another build script, e.g. to try this one.)
#   tools/ab_alternate.sh PATCH "python3 -m benchmarks.conv_matrix --platform gpu ..." [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
patch=$1 cmd=$2 rounds=${3:-2}
pkg=src/jax_causal_conv
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
build_into() {  # build the tree as it is, keep its modules in $keep/$1
  bash ${AB_BUILD:-tools/device_build.sh} || return 1
  mkdir -p "$keep/$1" && cp "$pkg"/_jcc_*.so "$pkg"/_build_info.py "$keep/$1/"
}
build_into base || exit 1
git apply "$patch" || { echo "$patch does not apply"; exit 1; }
build_into patched; ok=$?
git apply -R "$patch"
[ $ok -eq 0 ] || exit 1
files=()
for r in $(seq "$rounds"); do
  for v in base patched; do
    cp "$keep/$v"/* "$pkg"/
    timeout 300 bash -c "$cmd --json $OUT/$v$r.json" > "$OUT/$v$r.log" 2>&1
    echo "$v$r: rc $? ($(tail -1 "$OUT/$v$r.log" | cut -c1-80))"
    files+=("$OUT/$v$r.json")
  done
done
cp "$keep/base"/* "$pkg"/  # (the tree's own build left in place)
python3 -m benchmarks.matrix_compare "${files[@]}"
