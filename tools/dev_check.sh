#!/usr/bin/env bash
# Kernel-development pass on the device: build, the GPU tests (three
# processes), then the given probe commands one by one (timings on an idle
# GPU). Logs in $OUT.   tools/dev_check.sh "python3 -m benchmarks.probes.trace_probe conv" ...
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
t0=$SECONDS
bash tools/device_build.sh || exit 1
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  source tools/gpu_test_parts.sh
  ( gpu_test_parts 300; wait )
  for i in 1 2 3; do echo "test_gpu part $i: $(tail -1 "$OUT/test_gpu_$i.log")"; done
  grep -h -A15 "^_____" "$OUT"/test_gpu_*.log | grep -E "Error|assert|FAILED" | head -8
  echo "tests done: $((SECONDS - t0)) s"
fi
for cmd in "$@"; do
  echo "== $cmd"
  timeout 240 bash -c "$cmd" 2>&1 | grep -vE "^(WARNING|I0000|E0000|W0000)" | tail -60
done
echo "total: $((SECONDS - t0)) s"
