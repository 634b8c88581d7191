#!/usr/bin/env bash
# Runs the monolithic `genbridge run` and an mpirun `genbridge afd-worker` job on the same model and
# prompts; passes only when both print the same result lines and dump byte-identical logits (and, when the
# runs write --dump-choices to WORK_DIR/mono.choices and WORK_DIR/afd.choices, byte-identical choices).
# usage: compare_worker_with_run.sh GENBRIDGE MODEL_DIR WORK_DIR -- mpirun ... --dump-logits WORK_DIR/afd.npy
# (PROMPT_LEN in the environment: the monolithic run's --prompt-len, default 7; the worker's must match.
# RUN_ARGS: more flags for the monolithic run, e.g. "--weight-quant auto". EXPECT_LOG: an extended regex
# every line of which must match a line of the job's stderr.)
set -u
genbridge=$1 model=$2 work=$3
shift 3
[ "$1" = "--" ] && shift
rm -rf "$work" && mkdir -p "$work" || exit 1
# shellcheck disable=SC2086
"$genbridge" run --model "$model" --num-prompts 5 --prompt-len "${PROMPT_LEN:-7}" --max-new-tokens 4 --quiet ${RUN_ARGS:-} \
  --dump-logits "$work/mono.npy" > "$work/mono.txt" || { echo "FAIL: genbridge run failed"; exit 1; }
timeout -k 5 50 "$@" > "$work/afd.txt" 2> "$work/afd.err"
rc=$?
cat "$work/afd.txt" "$work/afd.err"
[ $rc -eq 0 ] || { echo "FAIL: the mpirun job exited with $rc"; exit 1; }
grep '^request ' "$work/mono.txt" > "$work/mono.results"
grep '^request ' "$work/afd.txt" > "$work/afd.results"
[ -s "$work/mono.results" ] || { echo "FAIL: genbridge run printed no results"; exit 1; }
diff "$work/mono.results" "$work/afd.results" || { echo "FAIL: the AFD job's results differ from genbridge run"; exit 1; }
cmp "$work/mono.npy" "$work/afd.npy" || { echo "FAIL: the AFD job's logits differ from genbridge run"; exit 1; }
if [ -e "$work/mono.choices" ]; then
  [ -s "$work/mono.choices" ] || { echo "FAIL: genbridge run wrote no choices"; exit 1; }
  cmp "$work/mono.choices" "$work/afd.choices" || { echo "FAIL: the AFD job's choices differ from genbridge run"; exit 1; }
fi
if [ -n "${EXPECT_LOG:-}" ]; then
  while IFS= read -r re; do
    grep -Eq -- "$re" "$work/afd.err" || { echo "FAIL: the job's stderr has no line matching: $re"; exit 1; }
  done <<< "$EXPECT_LOG"
fi
echo "PASS: $(wc -l < "$work/afd.results") results and $(stat -c %s "$work/afd.npy") bytes of logits identical"
