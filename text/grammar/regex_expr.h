#pragma once
// Regular expressions as grammar expressions (vLLM's guided_regex, JSON Schema's `pattern` and `format`): the
// subset that ECMAScript and Python `re` agree on, matched as a whole (a generated text is a full match).
//
//   supported    literals, `.` (any character but \n), classes [a-z], [^...], \d \D \w \W \s \S (ASCII),
//                escapes \n \t \r \f \v \0 \xHH \uHHHH \u{H..} and escaped punctuation, groups (...), (?:...),
//                (?<name>...), (?P<name>...), alternation |, quantifiers * + ? {n} {n,} {n,m} and their lazy
//                forms (laziness does not change the set of full matches), ^ at the start and $ at the end
//   refused      backreferences, lookaround, \b \B, inline flags, possessive quantifiers, ^ or $ elsewhere
// Each refusal is InvalidArgument naming the construct and its offset in the pattern.

#include <functional>
#include <string_view>

#include "genbridge/core/status.h"
#include "text/grammar/grammar.h"

namespace genbridge::text::grammar {

// How one code-point range of the pattern is spelled in the output: by default its UTF-8 bytes; inside a JSON
// string, its JSON encoding (json_string_chars in json_schema.h).
using CharEncoder = std::function<GrammarBuilder::Expr(GrammarBuilder&, char32_t lo, char32_t hi)>;

// The expression of the texts `pattern` matches as a whole. `max_repeat`: the largest {n,m} count accepted.
Result<GrammarBuilder::Expr> regex_expr(GrammarBuilder& b, std::string_view pattern, const CharEncoder& encode = {},
                                        int max_repeat = 1000);

}  // namespace genbridge::text::grammar
