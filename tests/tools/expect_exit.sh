#!/usr/bin/env bash
# Runs a command that must exit with exactly CODE, its output (stdout + stderr) matching MUST (an extended
# regex) and no line matching MUST_NOT. Prints the output either way.
# usage: expect_exit.sh CODE MUST MUST_NOT -- command...
set -u
code=$1 must=$2 must_not=$3
shift 3
[ "$1" = "--" ] && shift
out=$(timeout -k 5 50 "$@" 2>&1)
rc=$?
echo "$out"
echo "== exit status $rc"
fail=0
if [ "$rc" -ne "$code" ]; then echo "FAIL: exit status $rc, expected $code"; fail=1; fi
if ! echo "$out" | grep -Eq -- "$must"; then echo "FAIL: no output matches: $must"; fail=1; fi
if echo "$out" | grep -Eq -- "$must_not"; then echo "FAIL: output matches what must not appear: $must_not"; fail=1; fi
[ $fail -eq 0 ] && echo "PASS: exit status $code as expected"
exit $fail
