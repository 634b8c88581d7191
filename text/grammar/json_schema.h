#pragma once
// JSON and JSON Schema as grammar rules (OpenAI's response_format json_object / json_schema, vLLM's
// guided_json, the arguments of forced tool calls). docs/text.md ("Constrained decoding") lists the
// supported subset of JSON Schema; a schema using anything else is refused (InvalidArgument naming the
// keyword and where it sits), never generated loosely, so that every output validates.
//
// What is generated is a subset of what the schema accepts, chosen so that a model can always finish:
//   - whitespace between tokens: none, one space, or one or two newlines and up to `max_indent` spaces or tabs;
//   - objects list their properties in the schema's order (hence ordered_json), each required one once, optional ones
//   at most once;
//     properties not named in `properties` only where `properties` is empty and `additionalProperties` is
//     true or a schema (a free map);
//   - numbers have at most 16 integer and 16 fraction digits and a 2-digit exponent; bounded numbers are an
//     integer part within the bounds with an optional fraction (no exponent);
//   - strings with `pattern` or `format` are full matches written without \u escapes.

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "genbridge/core/status.h"
#include "text/grammar/grammar.h"

namespace genbridge::text::grammar {

struct JsonGrammarOptions {
  int max_indent = 20;    // spaces or tabs after a newline between tokens
  int max_repeat = 1000;  // the largest minLength / maxLength / minItems / maxItems / {n,m} accepted
};

// Adds JSON rules to a builder; rules for the same (sub)schema are made once.
class JsonRules {
 public:
  explicit JsonRules(GrammarBuilder& b, JsonGrammarOptions options = {});
  ~JsonRules();

  // The rule of the values `schema` accepts; $refs ("#/$defs/x", "#/definitions/x", "#") resolve within it.
  // InvalidArgument "<where><JSON pointer>: ..." for a keyword outside the subset or a schema no value matches.
  Result<RuleId> schema(const nlohmann::ordered_json& schema, const std::string& where = "");
  RuleId any_value();   // any JSON value
  RuleId any_object();  // any JSON object
  RuleId any_string();  // any JSON string (quotes included)
  // The whitespace allowed between tokens.
  GrammarBuilder::Expr ws();
  // The JSON string encodings of the code points [lo, hi] (a regex CharEncoder): the characters themselves,
  // and \" \\ and the escapes of control characters where they fall in the range.
  static GrammarBuilder::Expr json_chars(GrammarBuilder& b, char32_t lo, char32_t hi);

 private:
  struct Impl;
  Impl* impl_;
};

// A grammar of one JSON value `schema` accepts; `where` prefixes messages (e.g. "response_format.json_schema.schema").
Result<Grammar> json_schema_grammar(const nlohmann::ordered_json& schema, const std::string& where = "",
                                    const JsonGrammarOptions& options = {});
// A grammar of one JSON object (any content).
Result<Grammar> json_object_grammar(const JsonGrammarOptions& options = {});

}  // namespace genbridge::text::grammar
