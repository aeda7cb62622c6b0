#!/usr/bin/env bash
# Build the extension modules for sm_90 on the device machine into the package
# directory (logs to $OUT/build.log). Used by the device runs in tools/.
# JCC_DEV_DTYPES=bf16 (or e.g. bf16,f32) compiles only those dtypes' CUDA
# kernels (CMakeLists.txt), for a call that times or tests them alone: a
# faster build, whose other dtypes fail at run time.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
t0=$SECONDS
BUILD=${JCC_BUILD_DIR:-/tmp/jcc-build}  # (tools/ab_alternate.sh builds several trees at once)
# ninja goes by modification times, and the device machine's copy of a file
# may be older than an object built from an edited version in an earlier
# call (a planted bug, a sweep variant): touch every source whose content
# differs from what the last build here compiled, so it cannot be skipped.
SUMS=$BUILD/.source_sums
if [ -f "$SUMS" ]; then
  sha1sum -c --quiet "$SUMS" 2>/dev/null | sed -n 's/: FAILED.*//p' | xargs -r touch
fi
{ cmake -S . -B "$BUILD" -G Ninja -DSKBUILD_PROJECT_NAME=jax_causal_conv -DJCC_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DJCC_DEV_DTYPES=${JCC_DEV_DTYPES:-} \
    -DPython_EXECUTABLE=$(which python3) &&
  ninja -C "$BUILD" -j16 && cp "$BUILD"/_jcc_*.so "$BUILD"/_build_info.py src/jax_causal_conv/; } > "$OUT/build.log" 2>&1 \
  || { tail -40 "$OUT/build.log"; exit 1; }
find cuda csrc CMakeLists.txt -type f \( -name '*.c*' -o -name '*.h' -o -name '*.inc' -o -name '*.txt' \) \
  -print0 | xargs -0 sha1sum > "$SUMS"
echo "build: $((SECONDS - t0)) s${JCC_DEV_DTYPES:+ (CUDA kernels of $JCC_DEV_DTYPES only)}"
