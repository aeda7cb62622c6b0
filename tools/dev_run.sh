#!/usr/bin/env bash
# One development pass on the GPU machine, everything logged to $OUT:
# build (sm_90), the GPU tests in three processes beside compute-sanitizer
# memcheck on the probe, then the given commands (timings on an idle GPU).
# TEST_FILES picks the test files (default tests/test_gpu.py tests/test_gpu_mma.py tests/test_gpu_decode.py tests/test_gpu_seq_idx_stream.py tests/test_gpu_fwd_span.py tests/test_gpu_cl_slice.py);
# SKIP_TESTS=1 skips the tests and memcheck (build, then the commands).
#   tools/dev_run.sh "PYTEST_K" "cmd1" "cmd2" ...
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
t0=$SECONDS
bash tools/device_build.sh || exit 1
K=${1:-}; shift || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T=${TEST_TIMEOUT:-330}
memcheck() {  # part $1 of 4 of the probe under memcheck (tools/sanitize_probe.sh)
  ( source tools/sanitize_probe.sh && sanitize $T memcheck "$OUT/memcheck$1.log" -- "$1" 4 )
}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  ( timeout $T python3 -m pytest -q -p no:cacheprovider -n 3 ${TEST_FILES:-tests/test_gpu.py tests/test_gpu_mma.py tests/test_gpu_decode.py tests/test_gpu_seq_idx_stream.py tests/test_gpu_fwd_span.py tests/test_gpu_cl_slice.py} ${K:+-k "$K"} > "$OUT/test_gpu.log" 2>&1 &
    ( source tools/sanitize_probe.sh && warm_probe_cache 150 )  # (the programs compiled once, unsanitized)
    for part in 0 1 2 3; do
      memcheck $part &
      sleep 6
    done
    wait )
  # a part whose sanitizer died at start (no PROBE line) runs once more, alone
  for part in 0 1 2 3; do
    grep -q "PROBE" "$OUT/memcheck$part.log" || memcheck $part
  done
  summary=$(tail -1 "$OUT/test_gpu.log")
  if ! grep -qE "passed|failed|error|no tests" <<< "$summary"; then  # (killed by the timeout: count the progress marks)
    marks=$(grep -E '^[.FEsx]+( +\[ *[0-9]+%\])?$' "$OUT/test_gpu.log" | sed 's/ *\[.*//' | tr -d '\n')
    summary="cut by the ${T} s timeout after ${#marks} tests, $(tr -cd 'FE' <<< "$marks" | wc -c) failed or in error"
  fi
  echo "tests: $summary after $((SECONDS - t0)) s"
  grep -E "^(FAILED|ERROR)" "$OUT/test_gpu.log" | head -20
  grep -h -B2 -A12 "^_____" "$OUT/test_gpu.log" | grep -E "^E " | head -20
  for part in 0 1 2 3; do
    log="$OUT/memcheck$part.log"
    echo "memcheck $part: $(grep -m1 -E 'PROBE (OK|FAIL)' "$log") | $(grep -m1 'ERROR SUMMARY' "$log") | $(grep -m1 'EXIT STATUS' "$log") (9: errors; 124: timed out)"
    grep -m3 -E "Invalid|Device Frame|Error:" "$log" | cut -c1-240
  done
fi
for cmd in "$@"; do
  echo "== $cmd"
  timeout 300 bash -c "$cmd" 2>&1 | grep -vE "^(WARNING|I0000|E0000|W0000)" | tail -60
done
echo "total: $((SECONDS - t0)) s"
