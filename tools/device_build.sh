#!/usr/bin/env bash
# Build the extension modules for sm_90 on the device machine into the package
# directory (logs to $OUT/build.log). Used by the device runs in tools/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
t0=$SECONDS
{ cmake -S . -B /tmp/jcc-build -G Ninja -DSKBUILD_PROJECT_NAME=jax_causal_conv -DJCC_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DPython_EXECUTABLE=$(which python3) &&
  ninja -C /tmp/jcc-build -j16 && cp /tmp/jcc-build/_jcc_*.so /tmp/jcc-build/_build_info.py src/jax_causal_conv/; } > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
