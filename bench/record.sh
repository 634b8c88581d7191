#!/usr/bin/env bash
# Records the roofline benchmarks for docs/bench/: each benchmark under each CPU target, JSON per run,
# then the markdown tables (bench/support/bench_table.py).
#   bash bench/record.sh OUT_DIR [BENCH ...]     BENCH: roofs linear expert_ffn norm quant attention mla
#                                                      hyper_connection router linear_attention quant_linear engine
# Environment: TARGETS (default: every target this CPU can run down to avx2, e.g. "avx512 avx2"), REPS
# (repetitions, default 2), ROUNDS (default 1: every benchmark under every target, then again; a shared
# machine's slow moments then fall on every target alike), MIN_TIME (default 0.05 s), PRESET (default
# ascend950), FILTER (a --benchmark_filter for every run, default all rows).
# With more than one target, tables.md ends with the targets compared row by row (bench/support/target_table.py:
# each row's best time under every target, and the rows where the dispatcher's choice is slower than a lower one).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/record.sh OUT_DIR [BENCH ...]}
shift
mkdir -p "$out"
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=(roofs linear expert_ffn norm quant attention mla engine)
preset=${PRESET:-ascend950}
declare -A exe=([roofs]=bench.support.roofs_bench [linear]=bench.ops.linear.linear_bench [expert_ffn]=bench.ops.moe.expert_ffn_bench
                [norm]=bench.ops.norm.norm_bench [quant]=bench.ops.quant.quant_bench
                [attention]=bench.ops.attention.attention_bench [mla]=bench.ops.attention.mla_bench
                [hyper_connection]=bench.ops.residual.hyper_connection_bench [router]=bench.ops.moe.router_bench
                [linear_attention]=bench.ops.linear_attention.linear_attention_bench
                [quant_linear]=bench.ops.linear.quant_linear_bench [engine]=bench.engine.engine_bench)
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo "+dirty")
if [ -z "${TARGETS:-}" ]; then
  # The targets this build and CPU offer, best first, down to avx2 (sse4 and scalar are fallbacks, not contenders).
  TARGETS=$(GENBRIDGE_CPU_TARGET=best "build/$preset/tools/genbridge" info 2>&1 | sed -nE 's/.*cpu target: [^ ]+ \(available: ([^)]*)\).*/\1/p' |
            head -1 | tr ' ' '\n' | sed '/^avx2$/q' | tr '\n' ' ')
  [ -n "$TARGETS" ] || TARGETS="avx2 avx512"
fi
rounds=${ROUNDS:-1}
for round in $(seq 1 "$rounds"); do
for b in "${benches[@]}"; do
  for t in $TARGETS; do
    json="$out/$b.$t.json"
    [ "$rounds" -gt 1 ] && json="$out/$b.$t.round$round.json"
    cmd=(env GENBRIDGE_CPU_TARGET="$t" "build/$preset/bench/${exe[$b]}" --benchmark_repetitions="${REPS:-2}"
         --benchmark_min_time="${MIN_TIME:-0.05}" --benchmark_filter="${FILTER:-.}"
         --benchmark_out="$json" --benchmark_out_format=json)
    echo "== commit $commit, $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg): ${cmd[*]}" | tee -a "$out/commands.txt"
    "${cmd[@]}" >"${json%.json}.txt" 2>&1 || { echo "failed: see ${json%.json}.txt"; tail -5 "${json%.json}.txt"; }
    echo "   done $(date -u '+%T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/commands.txt"
  done
done
done
# The JSON files of benchmark $1 under the targets $2.. (one per round), as they exist.
runs_of() {
  local b=$1 t json
  shift
  for t in "$@"; do for json in "$out/$b.$t".json "$out/$b.$t".round*.json; do [ -s "$json" ] && echo "$json"; done; done
  return 0
}
for b in "${benches[@]}"; do
  for json in $(runs_of "$b" $TARGETS); do python3 bench/support/bench_table.py "$json"; done
done >"$out/tables.md"
if [ "$(echo $TARGETS | wc -w)" -gt 1 ]; then
  for b in "${benches[@]}"; do
    files=$(runs_of "$b" $TARGETS)
    [ -n "$files" ] && { python3 bench/support/target_table.py $files || true; }
  done >>"$out/tables.md"
fi
echo "tables: $out/tables.md"
