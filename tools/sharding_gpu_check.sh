#!/usr/bin/env bash
# Multi-GPU pass (nvidia-h200-x2): build, the sharding cases on the real GPUs,
# then the sequence-parallel benchmark into docs/benchmarks.md. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
bash tools/device_build.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q tests/test_sharding.py -k real_gpus > "$OUT/test_sharding_gpu.log" 2>&1
echo "sharding on GPUs: $(tail -1 "$OUT/test_sharding_gpu.log")"
timeout 200 python3 -m benchmarks.sharding_bench docs/benchmarks.md > "$OUT/sharding_bench.log" 2>&1
echo "sharding bench: exit $?"; grep -vE "^(WARNING|I0000|W0000)" "$OUT/sharding_bench.log" | tail -6
cp docs/benchmarks.md "$OUT/"
