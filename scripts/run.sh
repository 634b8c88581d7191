#!/usr/bin/env bash
# The README's first command: installs missing Debian packages, builds the ascend950 target (or the one
# named by GENBRIDGE_PRESET) and runs `genbridge run` with any extra arguments, e.g.
#   bash scripts/run.sh                     # synthetic 'small' model, 8 prompts, 32 new tokens each
#   bash scripts/run.sh --afd 2A1F          # the same, attention-FFN disaggregated, in-process
#   bash scripts/run.sh serve               # `genbridge serve`: the OpenAI API on http://127.0.0.1:8000
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
gb_install_deps
preset=${GENBRIDGE_PRESET:-ascend950}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --target genbridge -j "${GENBRIDGE_JOBS:-$(nproc)}"
if [ "${1:-}" = serve ]; then
  shift
  exec "build/$preset/tools/genbridge" serve "$@"
fi
exec "build/$preset/tools/genbridge" run "$@"
