#!/usr/bin/env bash
# Runs a command that must fail: exit status non-zero, within MAX_SECONDS, output matching MUST (an
# extended regex), and no line matching MUST_NOT (e.g. a result line). Prints the output either way.
# usage: expect_failure.sh MAX_SECONDS MUST MUST_NOT -- command...
set -u
max=$1 must=$2 must_not=$3
shift 3
[ "$1" = "--" ] && shift
start=$(date +%s%N)
out=$(timeout -k 5 $((max * 3)) "$@" 2>&1)
rc=$?
end=$(date +%s%N)
elapsed_ms=$(( (end - start) / 1000000 ))
elapsed="$((elapsed_ms / 1000)).$(printf '%03d' $((elapsed_ms % 1000)))"
echo "$out"
echo "== exit status $rc after ${elapsed} s"
fail=0
if [ $rc -eq 0 ]; then echo "FAIL: the command succeeded but must fail"; fail=1; fi
if [ $elapsed_ms -gt $((max * 1000)) ]; then echo "FAIL: took ${elapsed} s, more than ${max} s"; fail=1; fi
if ! echo "$out" | grep -Eq -- "$must"; then echo "FAIL: no output matches: $must"; fail=1; fi
if echo "$out" | grep -Eq -- "$must_not"; then echo "FAIL: output matches what must not appear: $must_not"; fail=1; fi
[ $fail -eq 0 ] && echo "PASS: failed as expected"
exit $fail
