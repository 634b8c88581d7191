#!/usr/bin/env bash
# Passes only when `GENBRIDGE run ARGS... --quiet` exits 0 and prints one result line per request, each
# "request R (length, N tokens): " followed by exactly N token ids.
# usage: run_generates.sh N GENBRIDGE ARGS...
set -u
n=$1 genbridge=$2
shift 2
start=$(date +%s%N)
out=$("$genbridge" run "$@" --quiet 2>&1)
rc=$?
end=$(date +%s%N)
[ $rc -eq 0 ] || { printf '%s\n' "$out" | tail -20; echo "FAIL: genbridge run exited with $rc"; exit 1; }
results=$(printf '%s\n' "$out" | grep '^request ')
[ -n "$results" ] || { printf '%s\n' "$out" | tail -20; echo "FAIL: no result lines"; exit 1; }
count=0
while IFS= read -r line; do
  count=$((count + 1))
  head=${line%%:*}
  ids=${line#*: }
  [ "$head" != "${head/(length, $n tokens)/}" ] || { echo "FAIL: '$head' is not '(length, $n tokens)'"; exit 1; }
  got=$(printf '%s\n' "$ids" | wc -w)
  [ "$got" -eq "$n" ] || { echo "FAIL: $head lists $got token ids, not $n"; exit 1; }
done <<< "$results"
echo "PASS: $count request(s) generated $n tokens each in $(( (end - start) / 1000000 )) ms"
