#!/usr/bin/env bash
# Passes only when `GENBRIDGE run ARGS... --quiet` exits with status RC and its output matches the
# extended regular expression PATTERN.
# usage: expect_run.sh RC PATTERN GENBRIDGE ARGS...
set -u
want_rc=$1 pattern=$2 genbridge=$3
shift 3
out=$("$genbridge" run "$@" --quiet 2>&1)
rc=$?
printf '%s\n' "$out" | head -20
[ "$rc" -eq "$want_rc" ] || { echo "FAIL: genbridge run exited with $rc, expected $want_rc"; exit 1; }
printf '%s\n' "$out" | grep -Eq -- "$pattern" || { echo "FAIL: no output line matches: $pattern"; exit 1; }
echo "PASS: exit $rc and the expected line"
