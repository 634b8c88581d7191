#!/usr/bin/env bash
# The README's test command: installs missing Debian dependencies, configures and builds both targets
# and the sanitizer build and runs their tests: every test in ascend950 (including the cross-target check),
# those whose results depend on the generation in ascend910, those of the code the sanitizers check in asan
# (docs/testing.md says which). On an x86-64 host it also cross-compiles the aarch64 build and runs its op
# and cross-CPU tests under qemu-aarch64, comparing their digests with the ascend950 build's
# (GENBRIDGE_SKIP_AARCH64=1 skips it). Fails when a build
# runs fewer tests than tests/EXPECTED_MIN_TESTS records. Prints each phase's wall and CPU time, ends with
# its wall time and then ctest's summary line for all builds together (the last line). GENBRIDGE_JOBS sets
# the parallelism of the builds and of ctest (default: nproc), GENBRIDGE_TEST_JOBS that of ctest alone.
# Timings and what each build covers: docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
source scripts/deps.sh
gb_prepare_tests

took() { local s=$((SECONDS - $1)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
# CPU seconds (user + system) of this shell's finished children, from the second line of the builtin `times`,
# which must run in this shell (a $(...) subshell has no children of its own). On a shared machine a
# phase's CPU time stays comparable where its wall time does not.
cpu_file=$(mktemp)
trap 'rm -f "$cpu_file"' EXIT
cpu_now() {
  times >"$cpu_file"
  cpu=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%d", s }' "$cpu_file")
}
phase_start() { phase_t=$SECONDS; cpu_now; phase_cpu=$cpu; }
# Prints "== NAME took 3m05s (CPU 341 s)".
phase_end() {
  cpu_now
  echo "== $1 took $(took $phase_t) (CPU $((cpu - phase_cpu)) s)"
}

# ascend950 first: it builds everything, and the builds after it find in ccache what they share with it (the
# generation-independent sources of ascend910, the kernels of asan).
phase_start
echo "== configure + build: ascend950 (with the cross-target check against ascend910)"
cmake --preset ascend950 -DGENBRIDGE_PEER_PROBE="$PWD/build/ascend910/tests/cross_target/gemma_probe" >/dev/null
cmake --build --preset ascend950 -j "$GB_JOBS"
phase_end "build ascend950"
phase_start
echo "== configure + build: ascend910 (the tests whose results depend on the generation)"
# The generation-independent tests (text, core, the CLI and server, the lint checks) run in ascend950
# and asan only; benchmarks build in ascend950.
cmake --preset ascend910 -DGENBRIDGE_BUILD_BENCH=OFF \
  -DGENBRIDGE_TEST_SUBSET="afd;build;cross_cpu;cross_target;generation;ops;runtime" >/dev/null
cmake --build --preset ascend910 -j "$GB_JOBS"
phase_end "build ascend910"
phase_start
echo "== configure + build: asan (ascend950 with AddressSanitizer + UBSan)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$GB_JOBS"
phase_end "build asan"

presets=(ascend950 ascend910 asan)
# aarch64: cross-compiled (cmake/toolchains/aarch64-linux-gnu.cmake); the op contract tests and the cross-CPU
# check run under qemu-aarch64 and its digests must equal the ascend950 build's.
if [ "$(uname -m)" = x86_64 ] && [ "${GENBRIDGE_SKIP_AARCH64:-0}" != 1 ]; then
  phase_start
  echo "== configure + build: aarch64 (cross-compiled; tests under qemu-aarch64 against ascend950's digests)"
  cmake --preset aarch64 -DGENBRIDGE_CROSS_CPU_PEER="$PWD/build/ascend950/tests" >/dev/null
  cmake --build --preset aarch64 -j "$GB_JOBS"
  phase_end "build aarch64"
  presets+=(aarch64)
fi
failed=0
for preset in "${presets[@]}"; do
  phase_start
  echo "== ctest: $preset"
  ctest --preset "$preset" -j "$GB_TEST_JOBS" --timeout 900 | tee "build/$preset/ctest.log" | grep -vE '^ *(Start|[0-9]+/[0-9]+ Test) ' || true
  grep -q '100% tests passed' "build/$preset/ctest.log" || failed=1
  # A test that skips itself says why (e.g. the several-hosts tests without network namespaces).
  grep -h '^SKIP: ' "build/$preset/Testing/Temporary/LastTest.log" 2>/dev/null | sort | uniq -c | sed -E 's/^ *([0-9]+) SKIP: /== \1 test(s) skipped: /' || true
  phase_end "ctest $preset"
done

# Tests run per build against the minimum recorded in tests/EXPECTED_MIN_TESTS ("<build> <count>" lines),
# so that tests lost from a build (a glob, a skipped directory, a discovery failure) fail the command.
total=0; bad=0; counts=""
for preset in "${presets[@]}"; do
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "build/$preset/ctest.log" | tail -1 || true)
  if [ -z "$line" ]; then
    echo "test.sh: build $preset: ctest printed no summary line (see build/$preset/ctest.log)"
    failed=1
    continue
  fi
  ran=$(echo "$line" | sed -E 's/.* out of ([0-9]+).*/\1/')
  total=$((total + ran))
  bad=$((bad + $(echo "$line" | sed -E 's/.*passed, ([0-9]+) tests failed.*/\1/')))
  min=$(awk -v b="$preset" '$1 == b { print $2 }' tests/EXPECTED_MIN_TESTS)
  counts="$counts $preset $ran (recorded ${min:-none});"
  if [ -z "$min" ]; then
    echo "test.sh: build $preset has no line in tests/EXPECTED_MIN_TESTS; add '$preset $ran'"
    failed=1
  elif [ "$ran" -lt "$min" ]; then
    echo "test.sh: build $preset ran $ran tests, $((min - ran)) fewer than the $min recorded in tests/EXPECTED_MIN_TESTS"
    failed=1
  elif [ "$ran" -gt "$min" ]; then
    echo "test.sh: build $preset ran $ran tests, $((ran - min)) more than recorded: raise its line in tests/EXPECTED_MIN_TESTS to '$preset $ran'"
  fi
done
echo "== tests run per build:${counts%;}"
cpu_now
echo "== wall time: $(took $start) (CPU $cpu s)"

# One summary line for all three builds, in ctest's own words.
pct=$(( total > 0 ? (100 * (total - bad)) / total : 0 ))
echo "$pct% tests passed, $bad tests failed out of $total"
exit $(( failed || bad ))
