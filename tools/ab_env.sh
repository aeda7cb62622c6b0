#!/usr/bin/env bash
# A/B of environment settings on one build, in one device call (the tree's
# modules as built, e.g. by tools/device_build.sh): ROUNDS times, the
# benchmark command once per setting, alternating (a1, b1, a2, b2, ...: a
# drift of the machine shows as a difference between rounds, not between
# settings), each run with `--json $OUT/NAME<round>.json` appended; then the
# side-by-side table of benchmarks/matrix_compare.py. Logs in
# $OUT/NAME<round>.log. A setting is NAME:VAR=VALUE[,VAR=VALUE...]. (For
# the choices the plan reads at each call: JCC_BWD_MMA, JCC_FWD_SPAN,
# JCC_CL_FWD_STEPS, ...)
#   tools/ab_env.sh "stream:JCC_BWD_MMA=0 mma:JCC_BWD_MMA=1" \
#       "python3 -m benchmarks.conv_matrix --platform gpu ..." [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/bench_lib.sh
export PYTHONPATH=$PWD/src:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
read -r -a settings <<< "$1"
cmd=$2 rounds=${3:-2}
files=()
for r in $(seq "$rounds"); do
  for s in "${settings[@]}"; do
    name=${s%%:*}
    IFS=, read -r -a vars <<< "${s#*:}"
    run_bench "$name$r" "$cmd" "${vars[@]}"
    files+=("$OUT/$name$r.json")
  done
done
python3 -m benchmarks.matrix_compare "${files[@]}"
