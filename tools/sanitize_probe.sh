# Sourced by gpu_check.sh and dev_run.sh: compute-sanitizer on
# tests/gpu_sanitize_probe.py without the crashes of earlier sessions.
# Those segfaults came inside the tool while XLA compiled the probe's
# programs under it (the log's last line: "Very slow compile" of a jitted
# program). So the probe first runs once without a sanitizer, filling a
# persistent compilation cache, and the sanitized runs load the programs
# from it. XLA's command buffers (CUDA graphs) are off in both, so that the
# cache keys match and each kernel is a plain launch under the tool.
# (docs/performance-log.md, thirty-fourth session: every tool over every
# case, five sanitizers at once, no crash.)
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/jcc-probe-cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer="

# warm_probe_cache SECONDS: the probe's cases once, in four processes (their
# results are not a check: the sanitized runs repeat them)
warm_probe_cache() {
  for part in 0 1 2 3; do
    timeout "$1" python3 tests/gpu_sanitize_probe.py $part 4 > "$OUT/probe_warm$part.log" 2>&1 &
  done
  wait
}

# sanitize SECONDS TOOL LOG [compute-sanitizer options] [-- probe arguments]:
# the probe under TOOL into LOG, its exit status at the log's end (9: errors
# found; 124: timed out)
sanitize() {
  local t=$1 tool=$2 log=$3; shift 3
  local opts=() args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  args=("$@")
  timeout "$t" compute-sanitizer --tool "$tool" --error-exitcode 9 "${opts[@]}" \
    python3 tests/gpu_sanitize_probe.py "${args[@]}" > "$log" 2>&1
  echo "EXIT STATUS $?" >> "$log"
}
