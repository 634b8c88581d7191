#!/usr/bin/env bash
# The README's test command: installs missing Debian dependencies, configures and builds both targets
# and the sanitizer build, and runs every test (including the cross-target check). Ends with ctest's
# summary line for all builds together.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
gb_install_deps

jobs=${GENBRIDGE_JOBS:-$(nproc)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo

echo "== configure + build: ascend910"
cmake --preset ascend910 -DGENBRIDGE_BUILD_BENCH=OFF >/dev/null  # benchmarks build in ascend950
cmake --build --preset ascend910 -j "$jobs"
echo "== configure + build: ascend950 (with the cross-target check against ascend910)"
cmake --preset ascend950 -DGENBRIDGE_PEER_PROBE="$PWD/build/ascend910/tests/cross_target/gemma_probe" >/dev/null
cmake --build --preset ascend950 -j "$jobs"
echo "== configure + build: asan (ascend950 with AddressSanitizer + UBSan)"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"

failed=0
for preset in ascend910 asan ascend950; do
  echo "== ctest: $preset"
  ctest --preset "$preset" -j "$jobs" --timeout 900 | tee "build/$preset/ctest.log" | grep -vE '^ *(Start|[0-9]+/[0-9]+ Test) ' || true
  grep -q '100% tests passed' "build/$preset/ctest.log" || failed=1
done

# One summary line for all three builds, in ctest's own words.
total=0; bad=0
for preset in ascend910 asan ascend950; do
  line=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "build/$preset/ctest.log" | tail -1)
  total=$((total + $(echo "$line" | sed -E 's/.* out of ([0-9]+).*/\1/')))
  bad=$((bad + $(echo "$line" | sed -E 's/.*passed, ([0-9]+) tests failed.*/\1/')))
done
pct=$(( total > 0 ? (100 * (total - bad)) / total : 0 ))
echo "$pct% tests passed, $bad tests failed out of $total"
exit $(( failed || bad ))
