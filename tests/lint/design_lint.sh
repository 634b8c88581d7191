#!/usr/bin/env bash
# Design lint (docs/design.md#ownership-rule invariants 1 and 5):
#  1. no generation or SoC name in code outside ops/target_providers/, runtime/device/, cmake/, tests/,
#     docs/ and bench/;
#  2. no operator name (a stable header's base name or module path) in any CMake file;
#  3. code outside the ops library (text/, runtime/, afd/, tools/) includes only the library's public headers
#     (include/genbridge/), never its private ones (core/, ops/).
# Usage: design_lint.sh <source root>. Exits 1 and lists every violation.
set -u
root=${1:?usage: design_lint.sh <source root>}
cd "$root" || exit 2
status=0

generation_re='Ascend9[0-9]{2}|910B|910_93|950PR|950DT|\bA[235]\b|\bis_a5\b'
code_files=$(find . -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' -o -name '*.c' \
    -o -name '*.in' -o -name '*.py' -o -name '*.sh' \) \
  -not -path './build/*' -not -path './.git/*' -not -path './ops/target_providers/*' -not -path './runtime/device/*' \
  -not -path './cmake/*' -not -path './tests/*' -not -path './docs/*' -not -path './bench/*' -not -path './.ci/*' | sort)
if [ -n "$code_files" ]; then
  hits=$(grep -H -n -E "$generation_re" $code_files || true)
  if [ -n "$hits" ]; then
    echo "design lint: generation or SoC names in feature code (rule: only ops/target_providers/ and runtime/device/ may name a generation):"
    echo "$hits"
    status=1
  fi
fi

cmake_files=$(find . -type f \( -name 'CMakeLists.txt' -o -name '*.cmake' -o -name '*.cmake.in' -o -name 'CMakePresets.json' \) \
  -not -path './build/*' -not -path './.git/*' | sort)
if [ -d include/genbridge/ops ]; then
  ops=$(cd include/genbridge/ops && find . -name '*.h' | sed -e 's|^\./||' -e 's|\.h$||' | sort)
  for op in $ops; do
    base=${op##*/}
    hits=$(grep -H -n -w -F -e "$base" -e "$op" $cmake_files || true)
    if [ -n "$hits" ]; then
      echo "design lint: operator '$op' named in CMake (rule: the build knows targets, not operators):"
      echo "$hits"
      status=1
    fi
  done
fi

dependent_files=$(find text runtime afd tools -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' \) \
  2>/dev/null | sort)
if [ -n "$dependent_files" ]; then
  hits=$(grep -H -n -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<](core|ops)/' $dependent_files || true)
  if [ -n "$hits" ]; then
    echo "design lint: private ops-library headers included outside the ops library (rule: text/, runtime/, afd/ and tools/ include only include/genbridge/ from the ops library):"
    echo "$hits"
    status=1
  fi
fi

[ $status -eq 0 ] && echo "design lint: clean ($(echo "$code_files" | wc -w) code files, $(echo "$cmake_files" | wc -w) CMake files)"
exit $status
