// text/grammar/json_schema: which texts each schema construct accepts (generated outputs are validated against
// a real JSON Schema validator, ajv, by tests/serve), and every refusal with the keyword's path.
#include "text/grammar/json_schema.h"

#include <gtest/gtest.h>

#include "text/grammar/matcher.h"

namespace genbridge::text::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Vocabulary> bytes_vocabulary() {
  static auto v = [] {
    std::vector<std::string> b;
    for (int i = 0; i < 256; ++i) b.push_back(std::string(1, static_cast<char>(i)));
    return Vocabulary::from_bytes(b, 256);
  }();
  return v;
}

struct Accepts {
  std::shared_ptr<const CompiledGrammar> cg;
  explicit Accepts(const std::string& schema) {
    auto g = json_schema_grammar(ojson::parse(schema));
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    cg = CompiledGrammar::compile(std::move(g).value(), bytes_vocabulary()).value();
  }
  bool operator()(const std::string& text) const {
    Matcher m(cg, {});
    return m.accept_bytes(text).ok() && m.complete();
  }
};

std::string refusal(const std::string& schema, const std::string& where = "") {
  auto g = json_schema_grammar(ojson::parse(schema), where);
  return g.ok() ? "ok" : g.status().message();
}

TEST(JsonSchema, object_properties_in_order_required_and_optional) {
  Accepts a(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                "c": {"type": "boolean"}}, "required": ["b"]})");
  EXPECT_TRUE(a(R"({"b": "x"})"));
  EXPECT_TRUE(a(R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(a(R"({"b":"x","c":false})"));
  EXPECT_TRUE(a("{\n  \"a\": -3,\n  \"b\": \"\"\n}"));
  EXPECT_FALSE(a(R"({"a": 1})"));            // b is required
  EXPECT_FALSE(a(R"({"b": "x", "a": 1})"));  // schema order
  EXPECT_FALSE(a(R"({"b": "x", "d": 1})"));  // no extra properties are generated
  EXPECT_FALSE(a(R"({"b": "x",})"));         // no trailing comma
}

TEST(JsonSchema, free_map_and_any_value) {
  Accepts map(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(map(R"({})"));
  EXPECT_TRUE(map(R"({"x": 1, "y": 2})"));
  EXPECT_FALSE(map(R"({"x": "1"})"));
  Accepts any("{}");
  EXPECT_TRUE(any(R"([1, {"a": [null, true, "s\n\u00e9\ud83d\ude00"]}, -0.5e+3])"));
  EXPECT_FALSE(any(R"("\ud83d")"));  // a lone surrogate escape
  EXPECT_FALSE(any("\"a\nb\""));     // a raw control character
}

TEST(JsonSchema, strings_length_pattern_format_enum_const) {
  Accepts len(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(len(R"("a")"));
  EXPECT_TRUE(len(R"("ab")"));
  EXPECT_TRUE(len("\"\xc3\xa9\\n\\u00e9\""));  // three characters, escaped or not
  EXPECT_FALSE(len(R"("abcd")"));
  Accepts pat(R"({"type": "string", "pattern": "^[a-z]+-\\d{2}$"})");
  EXPECT_TRUE(pat(R"("ab-12")"));
  EXPECT_FALSE(pat(R"("ab-1")"));
  Accepts quote(R"({"type": "string", "pattern": "a\"b\\\\"})");
  EXPECT_TRUE(quote(R"("a\"b\\")"));  // the pattern's characters JSON-escaped
  Accepts date(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(date(R"("2024-02-28T23:59:59.5Z")"));
  EXPECT_TRUE(date(R"("2024-12-01T00:00:00+05:30")"));
  EXPECT_FALSE(date(R"("2024-13-01T00:00:00Z")"));
  Accepts e(R"({"enum": ["red", 3, null, {"k": [1]}]})");
  EXPECT_TRUE(e(R"("red")"));
  EXPECT_TRUE(e(R"({"k":[1]})"));
  EXPECT_FALSE(e(R"("blue")"));
  Accepts c(R"({"const": "x", "nullable": true})");
  EXPECT_TRUE(c(R"("x")"));
  EXPECT_TRUE(c("null"));
}

TEST(JsonSchema, integer_and_number_bounds) {
  Accepts i(R"({"type": "integer", "minimum": -12, "exclusiveMaximum": 105})");
  for (int v = -30; v <= 130; ++v) EXPECT_EQ(i(std::to_string(v)), v >= -12 && v < 105) << v;
  EXPECT_FALSE(i("007"));
  EXPECT_FALSE(i("-0"));
  Accepts n(R"({"type": "number", "minimum": -1.5, "maximum": 2})");
  EXPECT_TRUE(n("2"));
  EXPECT_TRUE(n("1.999"));
  EXPECT_TRUE(n("-0.75"));
  EXPECT_TRUE(n("-1"));
  EXPECT_FALSE(n("2.5"));
  EXPECT_FALSE(n("-1.25"));  // -2 < -1.5: fractions below -1 are not generated
  EXPECT_FALSE(n("1e0"));
  Accepts free(R"({"type": "number"})");
  EXPECT_TRUE(free("-12.5e-3"));
  EXPECT_FALSE(free("1e100"));  // exponents have at most 2 digits
  EXPECT_FALSE(free("01"));
}

TEST(JsonSchema, arrays_items_tuples_and_counts) {
  Accepts a(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
  EXPECT_FALSE(a("[]"));
  EXPECT_TRUE(a("[1]"));
  EXPECT_TRUE(a("[1, 2,3]"));
  EXPECT_FALSE(a("[1,2,3,4]"));
  Accepts t(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false,
                "minItems": 1})");
  EXPECT_TRUE(t(R"(["a"])"));
  EXPECT_TRUE(t(R"(["a", true])"));
  EXPECT_FALSE(t(R"(["a", true, 1])"));
  EXPECT_FALSE(t(R"([true])"));
}

TEST(JsonSchema, refs_recursion_and_unions) {
  Accepts tree(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                   "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
                   "$ref": "#/$defs/node"})");
  EXPECT_TRUE(tree(R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  EXPECT_FALSE(tree(R"({"kids": []})"));
  Accepts u(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}], "title": "x"})");
  EXPECT_TRUE(u("7"));
  EXPECT_TRUE(u(R"("z")"));
  EXPECT_FALSE(u("true"));
}

TEST(JsonSchema, unsupported_keywords_are_refused_with_their_path) {
  EXPECT_EQ(refusal(R"({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}})", "guided_json"),
            "guided_json/properties/a/multipleOf: 'multipleOf' is not supported (except 1 on an integer)");
  EXPECT_EQ(refusal(R"({"type": "object", "minProperties": 1})"),
            "schema/minProperties: 'minProperties' is not supported by constrained decoding (docs/text.md lists the "
            "JSON Schema subset)");
  EXPECT_EQ(refusal(R"({"type": "string", "format": "hostname"})"),
            "schema/format: format 'hostname' is not supported (supported: date, date-time, email, ipv4, time, uuid)");
  EXPECT_EQ(refusal(R"({"type": "array", "uniqueItems": true})"),
            "schema/uniqueItems: 'uniqueItems': true is not supported");
  EXPECT_EQ(refusal(R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})"),
            "schema/allOf: 'allOf' with more than one schema is not supported");
  EXPECT_EQ(refusal(R"({"$ref": "https://example.com/s.json"})"),
            "schema/$ref: '$ref' \"https://example.com/s.json\" is not local (only \"#...\" references resolve)");
  EXPECT_EQ(refusal(R"({"$ref": "#/$defs/missing"})"),
            "schema/$ref: '$ref' \"#/$defs/missing\" names nothing in the schema");
  EXPECT_EQ(refusal(R"({"type": "string", "maxLength": 100000})"),
            "schema/maxLength: 'maxLength' is 100000; at most 1000 is supported for constrained decoding");
}

TEST(JsonSchema, schemas_no_value_matches_are_refused) {
  EXPECT_EQ(refusal("false"), "schema: the schema false matches no value");
  EXPECT_EQ(refusal(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "schema: no integer lies within the bounds [5, 4]");
  EXPECT_EQ(refusal(R"({"type": "string", "minLength": 3, "maxLength": 2})"),
            "schema: maxLength 2 is below minLength 3: no string matches");
  EXPECT_EQ(refusal(R"({"type": "object", "required": ["x"], "additionalProperties": false})"),
            "schema/required: required property 'x' is not in 'properties' and additionalProperties is false: no "
            "object matches");
  EXPECT_EQ(refusal(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
            "grammar: rule 'ref #/$defs/a' reaches a call of itself without reading a byte (left recursion, e.g. a "
            "$ref that refers to itself); such a grammar has no finite derivation to follow");
}

}  // namespace
}  // namespace genbridge::text::grammar
