export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1; t0=$SECONDS
cmake -S . -B /tmp/jcc-build -G Ninja -DSKBUILD_PROJECT_NAME=jax_causal_conv -DJCC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3) > /dev/null 2>&1 && ninja -C /tmp/jcc-build -j16 > $OUT/build.log 2>&1 && cp /tmp/jcc-build/_jcc_*.so jax_causal_conv/ || { tail -30 $OUT/build.log; exit 1; }
echo "build $((SECONDS-t0))s"; python3 tests/gpu_sanitize_probe.py 2>&1 | tail -1
timeout 60 ncu --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed python3 tests/gpu_kernel_probe.py 2>&1 | grep -A2 -E "^  void|^  unnamed" | grep -E "Stream|time_dur|dram" | head -9
python3 -m jax_causal_conv.bench gpu docs/benchmarks.md > $OUT/bench.log 2>&1; cp docs/benchmarks.md $OUT/; grep -E "\| ours|update|decode step" $OUT/bench.log | head -12
echo "t $((SECONDS-t0))s"; timeout 70 compute-sanitizer --tool memcheck python3 tests/gpu_sanitize_probe.py 2>&1 | grep -E "PROBE|ERROR SUMMARY" | head -2
timeout 100 python3 -m pytest -q -x tests/test_gpu.py -k "(small_forward_backward and not 33 and not 8 and not 5) or large" 2>&1 | tail -2; echo "total $((SECONDS-t0))s"
