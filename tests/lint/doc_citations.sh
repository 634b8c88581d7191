#!/usr/bin/env bash
# Citations in code stay true (docs/design.md): comments cite only the repository's own documents.
#  1. every `docs/<path>.md` named in a code file exists;
#  2. every section cited as `docs/<path>.md#<anchor>` (further anchors of the same document may follow as
#     `, #<anchor>`) is a heading of that document, in GitHub's anchor form (lower case, punctuation dropped,
#     spaces as hyphens);
#  3. no code file cites the team's reference outside the repository ("DESIGN §N") or an issue number.
# Usage: doc_citations.sh <source root>. Exits 1 and lists every violation.
set -u
root=${1:?usage: doc_citations.sh <source root>}
cd "$root" || exit 2
violations=$(mktemp)
trap 'rm -f "$violations"' EXIT

code_files=$(find . -type f \( -name '*.h' -o -name '*.hpp' -o -name '*.cpp' -o -name '*.cc' -o -name '*.c' \
    -o -name '*.in' -o -name '*.py' -o -name '*.sh' -o -name '*.mjs' -o -name '*.js' -o -name 'CMakeLists.txt' \
    -o -name '*.cmake' \) -not -path './build/*' -not -path './.git/*' -not -path '*/node_modules/*' \
    -not -path './tests/lint/*' | sort)

anchors_of() {  # the GitHub anchors of a markdown file's headings, one per line
  grep -E '^#{1,6} ' "$1" | sed -E 's/^#+ +//' | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9 _-]//g; s/ /-/g'
}

declare -A anchors
while IFS= read -r hit; do
  f=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}; cite=${rest#*:}
  doc=${cite%%#*}
  if [ ! -f "$doc" ]; then
    echo "$f:$line: cites $doc, which does not exist" >>"$violations"
    continue
  fi
  case "$cite" in *'#'*) ;; *) continue ;; esac
  [ -n "${anchors[$doc]+x}" ] || anchors[$doc]=$(anchors_of "$doc")
  for a in $(echo "${cite#*#}" | tr -d ' ' | tr ',' '\n' | sed 's/^#//'); do
    echo "${anchors[$doc]}" | grep -qx -- "$a" ||
      echo "$f:$line: cites $doc#$a, but $doc has no such section (its sections: $(echo ${anchors[$doc]}))" >>"$violations"
  done
done < <(grep -H -n -o -E 'docs/[A-Za-z0-9_/.-]+\.md(#[a-z0-9_-]+(, #[a-z0-9_-]+)*)?' $code_files 2>/dev/null)
grep -H -n -E 'DESIGN §|DESIGN\.md' $code_files 2>/dev/null | sed 's/$/  <- cites a document outside the repository/' >>"$violations"
grep -H -n -E '\b[Ii]ssues? #?[0-9]+\b' $code_files 2>/dev/null | sed 's/$/  <- an issue number in code/' >>"$violations"

if [ -s "$violations" ]; then
  echo "doc citations: code cites what the repository does not hold (rule: docs/design.md):"
  cat "$violations"
  exit 1
fi
echo "doc citations: clean ($(echo "$code_files" | wc -w) code files)"
