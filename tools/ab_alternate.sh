#!/usr/bin/env bash
# A/B of changes on the GPU machine, in one device call, the builds timed
# alternately: the tree as it is ("base") and, for each PATCH (one patch or
# several joined by commas, each named by its file's stem), a copy of the
# tree in /tmp/ab-tree-NAME with the patch applied (git apply), all built
# at once, each in its own build directory; then ROUNDS times run the
# benchmark command on base and on each patched build, swapping the
# modules in (base1, a1, b1, base2, ...: a drift of the machine shows as a
# difference between rounds, not between the builds). Each run appends
# `--json $OUT/NAME.json`; the side-by-side table of
# benchmarks/matrix_compare.py follows. A patched build's modules stay in
# its copy's src/jax_causal_conv/ (to test them afterwards in the same
# call). The records' kernel-sources digests name the tree on disk (the
# base) for every build. Logs in $OUT/NAME.log, build logs in
# $OUT/build-NAME/. (AB_BUILD: another build script, e.g. to try this
# one.)
#   tools/ab_alternate.sh PATCHES "python3 -m benchmarks.conv_matrix --platform gpu ..." [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/bench_lib.sh
export PYTHONPATH=$PWD/src:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
IFS=, read -r -a patches <<< "$1"
for i in "${!patches[@]}"; do patches[$i]=$(realpath "${patches[$i]}"); done
cmd=$2 rounds=${3:-2}
pkg=src/jax_causal_conv
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
build_into() {  # build the tree in directory $2, keep its modules in $keep/$1
  ( cd "$2" && OUT=$OUT/build-$1 JCC_BUILD_DIR=/tmp/jcc-build${3:-} bash ${AB_BUILD:-tools/device_build.sh} ) || return 1
  mkdir -p "$keep/$1" && cp "$2/$pkg"/_jcc_*.so "$2/$pkg"/_build_info.py "$keep/$1/"
}
names=(base)
pids=()
build_into base . & pids+=($!)
for patch in "${patches[@]}"; do
  name=$(basename "$patch" .patch) && names+=("$name") && copy=/tmp/ab-tree-$name
  rm -rf "$copy" && mkdir -p "$copy" && cp -a cuda csrc src tests tools CMakeLists.txt pyproject.toml "$copy/" &&
    rm -f "$copy/$pkg"/_jcc_*.so
  ( cd "$copy" && git apply "$patch" ) || { echo "$patch does not apply"; exit 1; }
  build_into "$name" "$copy" "-$name" & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "a build failed"; exit 1; }; done
echo "builds done after $SECONDS s"
files=()
for r in $(seq "$rounds"); do
  for v in "${names[@]}"; do
    cp "$keep/$v"/* "$pkg"/
    run_bench "$v$r" "$cmd"
    files+=("$OUT/$v$r.json")
  done
done
cp "$keep/base"/* "$pkg"/  # (the tree's own build left in place)
python3 -m benchmarks.matrix_compare "${files[@]}"
