#!/usr/bin/env bash
# Compile-time parameter sweep on the GPU machine, in one device call: for
# each variant, apply its sed expression to its file, rebuild (tools/
# device_build.sh: only what changed), run the benchmark command with
# `--json $OUT/NAME.json` appended, and restore the file (an expression
# @PATH copies the file at PATH over it instead). A variant with an
# empty expression times the tree as it is; `patch:PATH` applies the patch
# at PATH (git apply; any files, the third argument unused) and reverses it
# afterwards. Then the side-by-side table of
# benchmarks/matrix_compare.py. Logs in $OUT/NAME.log. Several benchmark
# commands, separated by " ;; ", all run on each variant's build (their
# files NAME.1.json, NAME.2.json, ..., a table each). (SWEEP_BUILD: another
# build script, e.g. /dev/null to try the script itself.)
#   tools/param_sweep.sh "python3 -m benchmarks.conv_matrix --platform gpu ..." \
#       base "" "" ch8 's/kIdChannels = 4;/kIdChannels = 8;/' cuda/stream_ids.cuh ...
set -uo pipefail
cd "$(dirname "$0")/.."
source tools/bench_lib.sh
export PYTHONPATH=$PWD/src:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
# the benchmark commands, split at " ;; "
cmds=()
rest=$1
while [[ $rest == *" ;; "* ]]; do cmds+=("${rest%% ;; *}"); rest=${rest#* ;; }; done
cmds+=("$rest")
shift
suffix() { [ ${#cmds[@]} -eq 1 ] && echo "" || echo ".$1"; }
names=()
while [ $# -ge 3 ]; do
  name=$1 expr=$2 file=$3; shift 3
  patch=
  if [[ $expr == patch:* ]]; then
    patch=${expr#patch:}
    git apply "$patch" || { echo "$name: $patch does not apply"; continue; }
  elif [ -n "$expr" ]; then
    cp "$file" "$OUT/.sweep_saved"
    if [[ $expr == @* ]]; then cp "${expr#@}" "$file"; else sed -i "$expr" "$file"; fi
    cmp -s "$file" "$OUT/.sweep_saved" && echo "$name: the expression changed nothing in $file"
  fi
  if bash ${SWEEP_BUILD:-tools/device_build.sh}; then
    for i in "${!cmds[@]}"; do
      f=$name$(suffix $((i + 1)))
      run_bench "$f" "${cmds[$i]}"
    done
    names+=("$name")
  fi
  if [ -n "$patch" ]; then git apply -R "$patch"; elif [ -n "$expr" ]; then cp "$OUT/.sweep_saved" "$file"; fi
done
for i in "${!cmds[@]}"; do
  files=()
  for name in "${names[@]}"; do files+=("$OUT/$name$(suffix $((i + 1))).json"); done
  [ ${#files[@]} -gt 0 ] && python3 -m benchmarks.matrix_compare "${files[@]}"
done
