#!/usr/bin/env bash
# Development build without pip: the CPU module (and the CUDA one with
# JCC_CUDA=ON) compiled into src/jax_causal_conv/, so that
# `PYTHONPATH=src python -m pytest tests` runs the working tree.
#   tools/dev_build_cpu.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-/tmp/jcc-dev-$(basename "$PWD")}
cmake -S . -B "$BUILD" -G Ninja -DSKBUILD_PROJECT_NAME=jax_causal_conv \
  -DJCC_CUDA=${JCC_CUDA:-OFF} -DPython_EXECUTABLE="$(which python3)" > "$BUILD.log" 2>&1 \
  || { tail -30 "$BUILD.log"; exit 1; }
ninja -C "$BUILD" -j"$(nproc)" >> "$BUILD.log" 2>&1 || { tail -40 "$BUILD.log"; exit 1; }
cp "$BUILD"/_jcc_*.so "$BUILD"/_build_info.py src/jax_causal_conv/
echo "built into src/jax_causal_conv/ ($BUILD)"
