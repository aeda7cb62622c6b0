# Sourced by gpu_check.sh: gpu_test_parts SECONDS starts the
# GPU test suite as four background pytest processes (one GPU holds them all;
# the tests are small; the third, the largest, in six workers: in one it ran
# past 330 s), logs in $OUT/test_gpu_{1,2,3,4}.log. The caller waits.
# (-k matches substrings: "float16" alone would pick the bfloat16 cases too.)
gpu_test_parts() {
  timeout "$1" python3 -m pytest -q tests/test_gpu.py -k "small_forward_backward and (float32 or (float16 and not bfloat16))" \
    > "$OUT/test_gpu_1.log" 2>&1 &
  timeout "$1" python3 -m pytest -q tests/test_gpu.py -k "small_forward_backward and bfloat16" \
    > "$OUT/test_gpu_2.log" 2>&1 &
  timeout "$1" python3 -m pytest -q -n 6 tests/test_gpu.py tests/test_gpu_mma.py tests/test_gpu_decode.py tests/test_gpu_seq_idx_stream.py tests/test_gpu_fwd_span.py -k "not small_forward_backward" \
    > "$OUT/test_gpu_3.log" 2>&1 &
  timeout "$1" python3 -m pytest -q tests/test_gpu_cl_slice.py tests/test_serving_gpu.py tests/test_gpu_bwd_mma.py \
    tests/test_gpu_seq_words.py \
    > "$OUT/test_gpu_4.log" 2>&1 &
}
