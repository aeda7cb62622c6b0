#!/usr/bin/env bash
# One pass on a GPU machine: build the CUDA kernels for this GPU, record the
# benchmark (into docs/benchmarks.md) on the idle GPU, then the GPU tests,
# the PyTorch CUDA tests, the >2^31-element test and compute-sanitizer on the
# reduced grid, side by side (correctness only). Logs go to ${OUT:-/tmp/gpu_check}.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD/src:$PWD
t0=$SECONDS
bash tools/device_build.sh || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 python3 -m benchmarks.bench gpu docs/benchmarks.md > "$OUT/bench.log" 2>&1
echo "bench: exit $? after $((SECONDS - t0)) s"; cp docs/benchmarks.md "$OUT/"
grep -E "\| ours|decode B|scan" "$OUT/bench.log" | head -20
T=${TEST_TIMEOUT:-280}
source tools/gpu_test_parts.sh
( gpu_test_parts $T
  timeout $T python3 -m pytest -q tests/test_torch.py -k "cuda or gpu" > "$OUT/test_torch.log" 2>&1 &
  timeout $T python3 -m pytest -q tests/test_scale.py > "$OUT/test_scale.log" 2>&1 &
  # the sanitizers from a filled compilation cache (tools/sanitize_probe.sh),
  # their starts staggered; initcheck on the two large walk cases apart,
  # only our streaming kernels instrumented
  ( source tools/sanitize_probe.sh
    warm_probe_cache 150
    sanitize $T memcheck "$OUT/sanitize_memcheck.log" & sleep 15
    sanitize $T racecheck "$OUT/sanitize_racecheck.log" & sleep 15
    PROBE_WALK=skip sanitize $T initcheck "$OUT/sanitize_initcheck.log" & sleep 15
    sanitize $T synccheck "$OUT/sanitize_synccheck.log" &
    wait
    PROBE_WALK=only sanitize $T initcheck "$OUT/sanitize_initcheck_walk.log" --kernel-name kns=Stream ) &
  wait )
# any tool that did not finish runs once more, alone
for tool in memcheck racecheck initcheck synccheck; do
  grep -q 'PROBE OK' "$OUT/sanitize_$tool.log" && continue
  echo "compute-sanitizer $tool did not finish; again, alone"
  ( source tools/sanitize_probe.sh
    PROBE_WALK=$([ $tool = initcheck ] && echo skip) sanitize $T $tool "$OUT/sanitize_$tool.log" )
done
for f in test_gpu_1 test_gpu_2 test_gpu_3 test_gpu_4 test_torch test_scale; do echo "$f: $(tail -1 "$OUT/$f.log")"; done
grep -h "^FAILED" "$OUT"/test_*.log | head -5
for tool in memcheck racecheck initcheck initcheck_walk synccheck; do
  echo "compute-sanitizer $tool: $(grep -m1 'PROBE OK' "$OUT/sanitize_$tool.log") | $(grep -m1 'SUMMARY' "$OUT/sanitize_$tool.log") | $(grep -m1 'EXIT STATUS' "$OUT/sanitize_$tool.log")"
done
echo "total: $((SECONDS - t0)) s"
