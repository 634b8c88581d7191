#!/usr/bin/env bash
# Records the roofline benchmarks for docs/bench/: each benchmark under each CPU target, JSON per run,
# then the markdown tables (bench/support/bench_table.py).
#   bash bench/record.sh OUT_DIR [BENCH ...]     BENCH: roofs linear expert_ffn norm quant attention mla
#                                                      hyper_connection engine
# Environment: TARGETS (default "avx2 avx512"), REPS (repetitions, default 2), MIN_TIME (default 0.05 s),
# PRESET (default ascend950), FILTER (a --benchmark_filter for every run, default all rows).
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
                [hyper_connection]=bench.ops.residual.hyper_connection_bench [engine]=bench.engine.engine_bench)
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo "+dirty")
for b in "${benches[@]}"; do
  for t in ${TARGETS:-avx2 avx512}; do
    json="$out/$b.$t.json"
    cmd=(env GENBRIDGE_CPU_TARGET="$t" "build/$preset/bench/${exe[$b]}" --benchmark_repetitions="${REPS:-2}"
         --benchmark_min_time="${MIN_TIME:-0.05}" --benchmark_filter="${FILTER:-.}"
         --benchmark_out="$json" --benchmark_out_format=json)
    echo "== commit $commit, $(date -u '+%F %T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg): ${cmd[*]}" | tee -a "$out/commands.txt"
    "${cmd[@]}" >"$out/$b.$t.txt" 2>&1 || { echo "failed: see $out/$b.$t.txt"; tail -5 "$out/$b.$t.txt"; }
    echo "   done $(date -u '+%T') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/commands.txt"
  done
done
for b in "${benches[@]}"; do
  for t in ${TARGETS:-avx2 avx512}; do
    [ -s "$out/$b.$t.json" ] && python3 bench/support/bench_table.py "$out/$b.$t.json"
  done
done >"$out/tables.md"
echo "tables: $out/tables.md"
