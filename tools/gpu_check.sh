#!/usr/bin/env bash
# One pass on a GPU machine: build the CUDA kernels for this GPU, run the GPU
# tests, the benchmark (into docs/benchmarks.md), compute-sanitizer on the
# reduced grid and the >2^31-element test. Logs go to ${OUT:-/tmp/gpu_check}.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=$PWD
arch=${CUDA_ARCH:-90}
t0=$SECONDS
{ cmake -S . -B /tmp/jcc-build -G Ninja -DSKBUILD_PROJECT_NAME=jax_causal_conv -DJCC_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=$arch -DPython_EXECUTABLE=$(which python3) &&
  ninja -C /tmp/jcc-build -j16 && cp /tmp/jcc-build/_jcc_*.so jax_causal_conv/; } > "$OUT/build.log" 2>&1 \
  || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the GPU suite in three processes (one GPU is enough; the tests are small)
( python3 -m pytest -q tests/test_gpu.py -k "small_forward_backward and (float32 or float16)" > "$OUT/test_gpu_1.log" 2>&1 &
  python3 -m pytest -q tests/test_gpu.py -k "small_forward_backward and bfloat16" > "$OUT/test_gpu_2.log" 2>&1 &
  python3 -m pytest -q tests/test_gpu.py -k "not small_forward_backward" > "$OUT/test_gpu_3.log" 2>&1 &
  wait )
for i in 1 2 3; do echo "test_gpu part $i: $(tail -1 "$OUT/test_gpu_$i.log")"; done
grep -h "^FAILED" "$OUT"/test_gpu_*.log | head -5
python3 -m pytest -q tests/test_torch.py -k "cuda or gpu" 2>&1 | tail -1
python3 -m jax_causal_conv.bench gpu docs/benchmarks.md > "$OUT/bench.log" 2>&1; tail -30 "$OUT/bench.log"
cp docs/benchmarks.md "$OUT/"
python3 -m pytest -q tests/test_scale.py 2>&1 | tail -2
for tool in memcheck racecheck initcheck synccheck; do
  timeout 110 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/gpu_sanitize_probe.py \
    > "$OUT/sanitize_$tool.log" 2>&1
  echo "compute-sanitizer $tool: exit $? | $(grep -m1 'PROBE OK' "$OUT/sanitize_$tool.log") | $(grep -m1 'ERROR SUMMARY' "$OUT/sanitize_$tool.log")"
done
echo "total: $((SECONDS - t0)) s"
