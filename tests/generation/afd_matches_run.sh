#!/usr/bin/env bash
# Runs the monolithic `genbridge run RUN_ARGS...` and an AFD command (in-process `genbridge run --afd ...`
# or `mpirun ... genbridge afd-worker ...`) that must dump its logits to WORK/afd.npy; passes only when
# both exit 0, print the same result lines and dump byte-identical logits.
# usage: afd_matches_run.sh GENBRIDGE WORK RUN_ARGS... -- AFD_COMMAND...
# (AFD_TIMEOUT_S in the environment: seconds the AFD command may run, default 50; MUST_PRINT: an extended regular
# expression a line of the AFD command's output must match, e.g. that what the case is about happened.)
set -u
genbridge=$1 work=$2
shift 2
run_args=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do run_args+=("$1"); shift; done
[ $# -gt 0 ] && shift
rm -rf "$work" && mkdir -p "$work" || exit 1
"$genbridge" run "${run_args[@]}" --quiet --dump-logits "$work/mono.npy" > "$work/mono.txt" 2> "$work/mono.err" ||
  { cat "$work/mono.err"; echo "FAIL: genbridge run failed"; exit 1; }
timeout -k 5 "${AFD_TIMEOUT_S:-50}" "$@" > "$work/afd.txt" 2> "$work/afd.err"
rc=$?
tail -5 "$work/afd.err"
[ $rc -eq 0 ] || { cat "$work/afd.txt"; echo "FAIL: the AFD command exited with $rc"; exit 1; }
grep '^request ' "$work/mono.txt" > "$work/mono.results"
grep '^request ' "$work/afd.txt" > "$work/afd.results"
[ -s "$work/mono.results" ] || { echo "FAIL: genbridge run printed no results"; exit 1; }
diff "$work/mono.results" "$work/afd.results" || { echo "FAIL: the AFD results differ from genbridge run"; exit 1; }
cmp "$work/mono.npy" "$work/afd.npy" || { echo "FAIL: the AFD logits differ from genbridge run"; exit 1; }
if [ -n "${MUST_PRINT:-}" ] && ! grep -Eq "$MUST_PRINT" "$work/afd.txt"; then
  grep -v '^request ' "$work/afd.txt"
  echo "FAIL: no line of the output matches '$MUST_PRINT'"
  exit 1
fi
echo "PASS: $(wc -l < "$work/afd.results") results ($(awk '{n += NF - 5} END {print n}' "$work/afd.results") tokens) and $(stat -c %s "$work/afd.npy") bytes of logits identical"
