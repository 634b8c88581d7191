#pragma once
// The pre-tokenizer regular expressions of tokenizer.json, run by PCRE2 (UTF + UCP, JIT-compiled where the
// platform supports it).
//
// Hugging Face's tokenizers run these patterns with Oniguruma. PCRE2 agrees with it on the constructs real
// tokenizer.json files use (\p{..} classes, look-ahead, (?i:..) groups) except for two shorthands, which
// are rewritten before compiling so that both engines match the same characters:
//   \s  PCRE2 also matches U+180E; Oniguruma matches exactly White_Space (U+0009..U+000D, U+0020, U+0085,
//       Zs, Zl, Zp) -> written out as that class.
//   \w  PCRE2 (10.42) matches \p{L}\p{N}_; Oniguruma matches \p{L}\p{M}\p{Nd}\p{Pc} -> written out.
// \S and \W outside a character class are rewritten as the negated classes; inside a class they have no
// class equivalent and are refused at load.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::text {

class Regex {
 public:
  // Compiles `pattern`; `where` names it in errors (e.g. "tokenizer.json: $.pre_tokenizer.pattern.Regex").
  static Result<Regex> compile(std::string_view pattern, std::string_view where);

  // Appends the [begin, end) byte ranges of successive non-overlapping matches in `text` (valid UTF-8) to
  // `out`. An empty match right after the previous match is skipped (the rule Oniguruma's and Rust's
  // iterators use). Thread-safe; the only error is PCRE2 running out of its match or stack limits.
  Status find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  // Whether the pattern runs JIT-compiled.
  bool jit() const { return jit_; }
  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
  std::string where_;
  bool jit_ = false;
};

// The Oniguruma-compatible rewrite described above (exposed for tests); InvalidArgument for \S or \W
// inside a character class.
Result<std::string> translate_oniguruma_pattern(std::string_view pattern, std::string_view where);

}  // namespace genbridge::text
