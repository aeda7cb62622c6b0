# Sourced by tools/ab_env.sh, tools/ab_alternate.sh and tools/param_sweep.sh:
# one benchmark run of a comparison.
# run_bench NAME CMD [VAR=VALUE ...]: CMD with `--json $OUT/NAME.json`
# appended (and the assignments in its environment), its output in
# $OUT/NAME.log, at most 300 s; prints NAME, the exit status and the log's
# last line.
run_bench() {
  local name=$1 cmd=$2
  shift 2
  timeout 300 env "$@" bash -c "$cmd --json $OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name: rc $? ($(tail -1 "$OUT/$name.log" | cut -c1-80))"
}
