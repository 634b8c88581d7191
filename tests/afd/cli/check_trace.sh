#!/usr/bin/env bash
# Runs a genbridge command with --trace FILE and checks that it exits 0 and that FILE is valid
# Chrome/Perfetto JSON ("traceEvents", complete events with ts/dur) with spans of every given category.
# usage: check_trace.sh FILE "CATEGORY ..." -- genbridge ARGS... (--trace FILE is appended)
set -u
file=$1 cats=$2
shift 2
[ "$1" = "--" ] && shift
rm -f "$file"
"$@" --trace "$file" > "$file.out" 2>&1
rc=$?
cat "$file.out"
[ $rc -eq 0 ] || { echo "FAIL: exit status $rc"; exit 1; }
[ -s "$file" ] || { echo "FAIL: no trace written to $file"; exit 1; }
python3 - "$file" $cats <<'PY'
import json, sys
path, want = sys.argv[1], sys.argv[2:]
t = json.load(open(path))
spans = [e for e in t["traceEvents"] if e["ph"] == "X"]
for e in spans:
    assert e["dur"] >= 0 and e["ts"] >= 0, e
seen = {}
for e in spans:
    seen[e["cat"]] = seen.get(e["cat"], 0) + 1
missing = [c for c in want if c not in seen]
if missing:
    print("FAIL: no spans of", missing, "in", path, "; categories:", seen)
    sys.exit(1)
print("PASS: valid trace,", len(spans), "spans:", seen)
PY
