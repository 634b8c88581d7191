#include "text/grammar/json_schema.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "text/grammar/regex_expr.h"

namespace genbridge::text::grammar {

using json = nlohmann::ordered_json;
using Expr = GrammarBuilder::Expr;

namespace {

// Keywords that only describe a schema (they never restrict which values match).
const std::set<std::string> kAnnotations = {
    "$schema",          "$id",          "$comment", "$anchor",   "title", "description", "default",
    "examples",         "deprecated",   "readOnly", "writeOnly", "$defs", "definitions", "contentEncoding",
    "contentMediaType", "discriminator"};
// Keywords generated as JSON Schema defines them (docs/text.md lists each one's rule).
const std::set<std::string> kSupported = {"type",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "nullable",  // any type
                                          "properties",
                                          "required",
                                          "additionalProperties",  // object
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "minItems",
                                          "maxItems",
                                          "uniqueItems",  // array
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",  // string
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "multipleOf"};  // number
// The formats a string can be generated in (a subset of each, which ajv-formats' full mode accepts).
const std::map<std::string, std::string> kFormats = {
    {"date", R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8]))"},
    {"time", R"(([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"date-time",
     R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d))"},
    {"uuid", R"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"},
    {"ipv4", R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
    {"email",
     R"([a-zA-Z0-9_+-]{1,32}(\.[a-zA-Z0-9_+-]{1,32}){0,3}@[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,20}[a-zA-Z0-9])?){1,3})"},
};
constexpr int kMaxDigits = 16;  // integer and fraction digits of unbounded numbers
constexpr int kMaxSchemaDepth = 64;

std::string join_keys(const std::map<std::string, std::string>& m) {
  std::string s;
  for (const auto& [k, v] : m) s += (s.empty() ? "" : ", ") + k;
  return s;
}

std::string pointer_escape(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

int num_digits(uint64_t v) {
  int n = 1;
  while (v >= 10) {
    v /= 10;
    ++n;
  }
  return n;
}

uint64_t pow10(int n) {
  uint64_t v = 1;
  while (n-- > 0) v *= 10;
  return v;
}

}  // namespace

struct JsonRules::Impl {
  GrammarBuilder& b;
  JsonGrammarOptions o;
  std::map<std::string, RuleId> rules;
  RuleId value = -1, object = -1, array = -1, string = -1, number = -1, integer = -1;
  const json* root = nullptr;
  std::string where;

  Impl(GrammarBuilder& builder, JsonGrammarOptions options) : b(builder), o(options) {}

  Status error(const std::string& ptr, const std::string& what) const {
    return invalid_argument(fmt::format("{}{}: {}", where.empty() ? "schema" : where, ptr, what));
  }

  Expr ws() {
    Expr space = b.alt({b.bytes(' ', ' '), b.bytes('\t', '\t')});
    return b.alt(
        {b.empty(), b.literal(" "), b.seq({b.repeat(b.literal("\n"), 1, 2), b.repeat(space, 0, o.max_indent)})});
  }
  Expr digit() { return b.bytes('0', '9'); }

  // One character of a JSON string, raw or escaped (\uXXXX of a non-surrogate, or a surrogate pair).
  Expr string_char() {
    Expr hex = b.alt({b.bytes('0', '9'), b.bytes('a', 'f'), b.bytes('A', 'F')});
    Expr bmp = b.alt(
        {b.seq({b.alt({b.bytes('0', '9'), b.bytes('a', 'c'), b.bytes('A', 'C'), b.bytes('e', 'f'), b.bytes('E', 'F')}),
                hex, hex, hex}),
         b.seq({b.alt({b.bytes('d', 'd'), b.bytes('D', 'D')}), b.bytes('0', '7'), hex, hex})});
    Expr pair =
        b.seq({b.alt({b.bytes('d', 'd'), b.bytes('D', 'D')}),
               b.alt({b.bytes('8', '9'), b.bytes('a', 'b'), b.bytes('A', 'B')}), hex, hex, b.literal("\\u"),
               b.alt({b.bytes('d', 'd'), b.bytes('D', 'D')}), b.alt({b.bytes('c', 'f'), b.bytes('C', 'F')}), hex, hex});
    Expr escape =
        b.seq({b.literal("\\"), b.alt({b.bytes('"', '"'), b.bytes('\\', '\\'), b.bytes('/', '/'), b.bytes('b', 'b'),
                                       b.bytes('f', 'f'), b.bytes('n', 'n'), b.bytes('r', 'r'), b.bytes('t', 't'),
                                       b.seq({b.literal("u"), b.alt({bmp, pair})})})});
    return b.alt({b.codepoints(0x20, 0x21), b.codepoints(0x23, 0x5B), b.codepoints(0x5D, 0x10FFFF), escape});
  }

  RuleId string_rule(int min, int max) {
    const std::string key = fmt::format("string{{{},{}}}", min, max);
    if (auto it = rules.find(key); it != rules.end()) return it->second;
    const RuleId r = b.rule(key, b.seq({b.literal("\""), b.repeat(string_char(), min, max), b.literal("\"")}));
    rules[key] = r;
    return r;
  }

  Expr uint_digits(int max_digits) {  // 0, or no leading zero
    return b.alt({b.literal("0"), b.seq({b.bytes('1', '9'), b.repeat(digit(), 0, max_digits - 1)})});
  }

  RuleId number_rule() {
    if (number < 0) {
      Expr frac = b.seq({b.literal("."), b.repeat(digit(), 1, kMaxDigits)});
      Expr exp = b.seq({b.alt({b.bytes('e', 'e'), b.bytes('E', 'E')}),
                        b.optional(b.alt({b.bytes('+', '+'), b.bytes('-', '-')})), b.repeat(digit(), 1, 2)});
      number = b.rule("number",
                      b.seq({b.optional(b.literal("-")), uint_digits(kMaxDigits), b.optional(frac), b.optional(exp)}));
    }
    return number;
  }
  RuleId integer_rule() {
    if (integer < 0) integer = b.rule("integer", b.seq({b.optional(b.literal("-")), uint_digits(kMaxDigits)}));
    return integer;
  }

  // Decimal strings of the same length a <= b (no sign).
  Expr same_length(const std::string& a, const std::string& c) {
    if (a.empty()) return b.empty();
    if (a[0] == c[0]) return b.seq({b.bytes(a[0], a[0]), same_length(a.substr(1), c.substr(1))});
    const size_t n = a.size() - 1;
    const bool lo_full = a.find_first_not_of('0', 1) == std::string::npos;
    const bool hi_full = c.find_first_not_of('9', 1) == std::string::npos;
    std::vector<Expr> parts;
    if (!lo_full) parts.push_back(b.seq({b.bytes(a[0], a[0]), same_length(a.substr(1), std::string(n, '9'))}));
    const char from = static_cast<char>(a[0] + (lo_full ? 0 : 1)), to = static_cast<char>(c[0] - (hi_full ? 0 : 1));
    if (from <= to) {
      parts.push_back(b.seq({b.bytes(static_cast<uint8_t>(from), static_cast<uint8_t>(to)),
                             b.repeat(digit(), static_cast<int>(n), static_cast<int>(n))}));
    }
    if (!hi_full) parts.push_back(b.seq({b.bytes(c[0], c[0]), same_length(std::string(n, '0'), c.substr(1))}));
    return b.alt(std::move(parts));
  }
  // The decimal spellings (no leading zeros) of the integers in [lo, hi], 0 <= lo <= hi.
  Expr uint_range(uint64_t lo, uint64_t hi) {
    std::vector<Expr> parts;
    for (int len = num_digits(lo); len <= num_digits(hi); ++len) {
      const uint64_t a = std::max(lo, len == 1 ? uint64_t{0} : pow10(len - 1));
      const uint64_t c = std::min(hi, pow10(len) - 1);
      if (a <= c) parts.push_back(same_length(std::to_string(a), std::to_string(c)));
    }
    return b.alt(std::move(parts));
  }
  // Integers in [lo, hi] (each within +-(10^17 - 1)), signed.
  Expr int_range(int64_t lo, int64_t hi) {
    std::vector<Expr> parts;
    if (lo < 0) {
      const uint64_t a = static_cast<uint64_t>(hi < 0 ? -hi : 1), c = static_cast<uint64_t>(-lo);
      if (a <= c) parts.push_back(b.seq({b.literal("-"), uint_range(a, c)}));
    }
    if (hi >= 0)
      parts.push_back(uint_range(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi)));
    return b.alt(std::move(parts));
  }

  Result<Expr> numeric(const json& s, const std::string& ptr, bool integer_only) {
    std::optional<double> lo, hi;
    bool lo_excl = false, hi_excl = false;
    for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "multipleOf"}) {
      if (!s.contains(k)) continue;
      const json& v = s[k];
      if (!v.is_number()) {
        return error(ptr + "/" + k,
                     fmt::format("'{}' must be a number (the boolean form of draft 4 is not supported)", k));
      }
      const double d = v.get<double>();
      const std::string key = k;
      if (key == "minimum" && (!lo || d > *lo || (d == *lo && lo_excl))) lo = d, lo_excl = false;
      if (key == "exclusiveMinimum" && (!lo || d >= *lo)) lo = d, lo_excl = true;
      if (key == "maximum" && (!hi || d < *hi || (d == *hi && hi_excl))) hi = d, hi_excl = false;
      if (key == "exclusiveMaximum" && (!hi || d <= *hi)) hi = d, hi_excl = true;
      if (key == "multipleOf" && !(integer_only && d == 1)) {
        return error(ptr + "/multipleOf", "'multipleOf' is not supported (except 1 on an integer)");
      }
    }
    if (!lo && !hi) return b.call(integer_only ? integer_rule() : number_rule());
    // Integer bounds of the integer part, within what 17 digits hold.
    constexpr double kCap = 99999999999999999.0;  // 10^17 - 1
    const int64_t cap = static_cast<int64_t>(pow10(kMaxDigits) - 1);
    int64_t L = -cap, H = cap;
    if (lo) {
      const double l = std::clamp(lo_excl ? std::floor(*lo) + 1 : std::ceil(*lo), -kCap, kCap);
      L = static_cast<int64_t>(l);
    }
    if (hi) {
      const double h = std::clamp(hi_excl ? std::ceil(*hi) - 1 : std::floor(*hi), -kCap, kCap);
      H = static_cast<int64_t>(h);
    }
    if (L > H) {
      return error(ptr,
                   fmt::format("no {} lies within the bounds {}{}, {}{}", integer_only ? "integer" : "integer part",
                               lo_excl ? "(" : "[", lo ? fmt::format("{}", *lo) : "-inf",
                               hi ? fmt::format("{}", *hi) : "inf", hi_excl ? ")" : "]"));
    }
    std::vector<Expr> parts{int_range(L, H)};
    if (!integer_only) {
      // n.f lies in [n, n + 1) and -n.f in (-(n + 1), -n]: a fraction keeps the value within the bounds where the
      // next integer does (no upper bound: every n).
      Expr frac = b.seq({b.literal("."), b.repeat(digit(), 1, kMaxDigits)});
      const int64_t pos_hi = hi ? H - 1 : H;
      if (std::max<int64_t>(L, 0) <= pos_hi) {
        parts.push_back(
            b.seq({uint_range(static_cast<uint64_t>(std::max<int64_t>(L, 0)), static_cast<uint64_t>(pos_hi)), frac}));
      }
      const int64_t neg_lo = std::max<int64_t>(0, -H), neg_hi = lo ? -L - 1 : cap;
      if (neg_lo <= neg_hi) {
        parts.push_back(
            b.seq({b.literal("-"), uint_range(static_cast<uint64_t>(neg_lo), static_cast<uint64_t>(neg_hi)), frac}));
      }
    }
    return b.alt(std::move(parts));
  }

  Result<int> count(const json& s, const std::string& ptr, const char* key, int dflt) {
    if (!s.contains(key)) return dflt;
    const json& v = s[key];
    if (!(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0))) {
      return Status(error(ptr + "/" + key, fmt::format("'{}' must be a non-negative integer, got {}", key, v.dump())));
    }
    if (v.get<uint64_t>() > static_cast<uint64_t>(o.max_repeat)) {
      return Status(error(ptr + "/" + key, fmt::format("'{}' is {}; at most {} is supported for constrained decoding",
                                                       key, v.dump(), o.max_repeat)));
    }
    return static_cast<int>(v.get<uint64_t>());
  }

  Result<Expr> string_expr(const json& s, const std::string& ptr) {
    auto min = count(s, ptr, "minLength", 0);
    if (!min.ok()) return min.status();
    auto max = count(s, ptr, "maxLength", GrammarBuilder::kUnbounded);
    if (!max.ok()) return max.status();
    if (*max != GrammarBuilder::kUnbounded && *max < *min) {
      return error(ptr, fmt::format("maxLength {} is below minLength {}: no string matches", *max, *min));
    }
    std::optional<std::string> pattern;
    std::string pattern_ptr;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return error(ptr + "/pattern", "'pattern' must be a string");
      pattern = s["pattern"].get<std::string>();
      pattern_ptr = ptr + "/pattern";
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) return error(ptr + "/format", "'format' must be a string");
      const std::string f = s["format"].get<std::string>();
      auto it = kFormats.find(f);
      if (it == kFormats.end()) {
        return error(ptr + "/format",
                     fmt::format("format '{}' is not supported (supported: {})", f, join_keys(kFormats)));
      }
      if (pattern) return error(ptr, "'pattern' together with 'format' is not supported");
      pattern = it->second;
      pattern_ptr = ptr + "/format";
    }
    if (pattern) {
      if (s.contains("minLength") || s.contains("maxLength")) {
        return error(ptr, "'minLength' / 'maxLength' together with 'pattern' or 'format' is not supported");
      }
      auto e = regex_expr(b, *pattern, &JsonRules::json_chars, o.max_repeat);
      if (!e.ok()) return error(pattern_ptr, e.status().message());
      return b.seq({b.literal("\""), *e, b.literal("\"")});
    }
    if (*min == 0 && *max == GrammarBuilder::kUnbounded) return b.call(any_string());
    return b.call(string_rule(*min, *max));
  }

  RuleId any_string() {
    if (string < 0) string = string_rule(0, GrammarBuilder::kUnbounded);
    return string;
  }

  void make_any() {
    if (value >= 0) return;
    value = b.declare("value");
    object = b.declare("object");
    array = b.declare("array");
    const RuleId str = any_string();
    Expr member = b.seq({b.call(str), ws(), b.literal(":"), ws(), b.call(value), ws()});
    b.define(object,
             b.seq({b.literal("{"), ws(), b.optional(b.seq({member, b.star(b.seq({b.literal(","), ws(), member}))})),
                    b.literal("}")}));
    Expr element = b.seq({b.call(value), ws()});
    b.define(array,
             b.seq({b.literal("["), ws(), b.optional(b.seq({element, b.star(b.seq({b.literal(","), ws(), element}))})),
                    b.literal("]")}));
    b.define(value, b.alt({b.call(object), b.call(array), b.call(str), b.call(number_rule()), b.literal("true"),
                           b.literal("false"), b.literal("null")}));
  }

  Result<Expr> object_expr(const json& s, const std::string& ptr, int depth) {
    std::vector<std::pair<std::string, const json*>> props;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return error(ptr + "/properties", "'properties' must be an object");
      for (const auto& [name, sub] : s["properties"].items()) props.emplace_back(name, &sub);
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return error(ptr + "/required", "'required' must be a list of names");
      for (const json& n : s["required"]) {
        if (!n.is_string()) return error(ptr + "/required", "'required' must be a list of names");
        required.insert(n.get<std::string>());
      }
    }
    const json* additional = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    const bool closed = additional && additional->is_boolean() && !additional->get<bool>();
    static const json kAny = true;
    for (const std::string& r : required) {
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; })) {
        if (closed) {
          return error(ptr + "/required",
                       fmt::format("required property '{}' is not in 'properties' and additionalProperties is false: "
                                   "no object matches",
                                   r));
        }
        props.emplace_back(r, additional && !additional->is_boolean() ? additional : &kAny);
      }
    }
    if (props.empty() && additional && !closed) {  // a free map: any keys, values of `additional`
      RuleId v;
      if (additional->is_boolean()) {
        make_any();
        v = value;
      } else {
        auto r = compile(*additional, ptr + "/additionalProperties", depth + 1);
        if (!r.ok()) return r.status();
        v = *r;
      }
      Expr member = b.seq({b.call(any_string()), ws(), b.literal(":"), ws(), b.call(v), ws()});
      return b.seq({b.literal("{"), ws(), b.optional(b.seq({member, b.star(b.seq({b.literal(","), ws(), member}))})),
                    b.literal("}")});
    }
    // Properties in order: first(i) before anything was written, more(i) after (a comma first).
    const size_t n = props.size();
    std::vector<Expr> kv(n);
    std::vector<bool> req(n);
    for (size_t i = 0; i < n; ++i) {
      auto r = compile(*props[i].second, ptr + "/properties/" + pointer_escape(props[i].first), depth + 1);
      if (!r.ok()) return r.status();
      kv[i] = b.seq({b.literal(json(props[i].first).dump()), ws(), b.literal(":"), ws(), b.call(*r), ws()});
      req[i] = required.count(props[i].first) > 0;
    }
    std::vector<Expr> more(n + 1), first(n + 1);
    more[n] = b.empty();
    first[n] = b.empty();
    for (size_t i = n; i-- > 0;) {
      Expr item = b.seq({b.literal(","), ws(), kv[i]});
      more[i] = b.seq({req[i] ? item : b.optional(item), more[i + 1]});
      Expr here = b.seq({kv[i], more[i + 1]});
      first[i] = req[i] ? here : b.alt({here, first[i + 1]});
    }
    return b.seq({b.literal("{"), ws(), first[0], b.literal("}")});
  }

  Result<Expr> array_expr(const json& s, const std::string& ptr, int depth) {
    auto min = count(s, ptr, "minItems", 0);
    if (!min.ok()) return min.status();
    auto max = count(s, ptr, "maxItems", GrammarBuilder::kUnbounded);
    if (!max.ok()) return max.status();
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) {
      return error(ptr + "/uniqueItems", "'uniqueItems': true is not supported");
    }
    std::vector<RuleId> prefix;
    std::optional<RuleId> rest;  // the schema of the items after the prefix; nullopt: none allowed
    const json* tuple = nullptr;
    const json* after = nullptr;
    std::string tuple_ptr, after_ptr;
    if (s.contains("prefixItems")) {
      tuple = &s["prefixItems"];
      tuple_ptr = ptr + "/prefixItems";
      if (s.contains("items")) after = &s["items"], after_ptr = ptr + "/items";
    } else if (s.contains("items") && s["items"].is_array()) {  // draft 7 tuples
      tuple = &s["items"];
      tuple_ptr = ptr + "/items";
      if (s.contains("additionalItems")) after = &s["additionalItems"], after_ptr = ptr + "/additionalItems";
    } else if (s.contains("items")) {
      after = &s["items"];
      after_ptr = ptr + "/items";
    }
    if (tuple) {
      if (!tuple->is_array()) return error(tuple_ptr, "a tuple must be a list of schemas");
      for (size_t i = 0; i < tuple->size(); ++i) {
        auto r = compile((*tuple)[i], fmt::format("{}/{}", tuple_ptr, i), depth + 1);
        if (!r.ok()) return r.status();
        prefix.push_back(*r);
      }
    }
    if (after && after->is_boolean() && !after->get<bool>()) {
      rest.reset();
    } else if (after && !after->is_boolean()) {
      auto r = compile(*after, after_ptr, depth + 1);
      if (!r.ok()) return r.status();
      rest = *r;
    } else {
      make_any();
      rest = value;
    }
    const int k = static_cast<int>(prefix.size());
    int hi = *max;
    if (!rest) hi = hi == GrammarBuilder::kUnbounded ? k : std::min(hi, k);
    if (hi != GrammarBuilder::kUnbounded && hi < *min) {
      return error(ptr, fmt::format("at most {} items fit but minItems is {}: no array matches", hi, *min));
    }
    auto sep = [&](int j) { return j == 0 ? b.empty() : b.seq({b.literal(","), ws()}); };
    // The items from index j on (a nested chain over the prefix, then the uniform rest).
    std::vector<Expr> tail(static_cast<size_t>(k) + 1);
    {
      // From index k: the rest's items, j = k .. hi - 1.
      if (!rest || (hi != GrammarBuilder::kUnbounded && hi <= k)) {
        tail[k] = b.empty();
      } else {
        Expr item0 = b.seq({sep(k), b.call(*rest), ws()});
        Expr item = b.seq({sep(k + 1), b.call(*rest), ws()});
        const int need = std::max(*min - k, 0);
        const int upto = hi == GrammarBuilder::kUnbounded ? GrammarBuilder::kUnbounded : hi - k;
        if (k == 0) {
          // The first item has no comma before it.
          Expr more = b.repeat(item, std::max(need - 1, 0),
                               upto == GrammarBuilder::kUnbounded ? GrammarBuilder::kUnbounded : upto - 1);
          tail[k] = need > 0 ? b.seq({item0, more}) : b.optional(b.seq({item0, more}));
        } else {
          tail[k] = b.repeat(item, need, upto);
        }
      }
      for (int j = k - 1; j >= 0; --j) {
        Expr here = b.seq({sep(j), b.call(prefix[j]), ws(), tail[j + 1]});
        tail[j] = j < *min ? here : b.optional(here);
      }
    }
    return b.seq({b.literal("["), ws(), tail[0], b.literal("]")});
  }

  Result<RuleId> resolve_ref(const std::string& ref, const std::string& ptr, int depth) {
    if (ref.empty() || ref[0] != '#') {
      return Status(error(ptr + "/$ref",
                          fmt::format("'$ref' {} is not local (only \"#...\" references resolve)", json(ref).dump())));
    }
    const std::string key = fmt::format("ref:{}:{}", static_cast<const void*>(root), ref);
    if (auto it = rules.find(key); it != rules.end()) return it->second;
    const json* target = root;
    try {
      target = &root->at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      return Status(error(ptr + "/$ref", fmt::format("'$ref' {} names nothing in the schema", json(ref).dump())));
    }
    const RuleId r = b.declare("ref " + ref);
    rules[key] = r;
    auto t = compile(*target, ref.substr(1), depth + 1);
    if (!t.ok()) return t.status();
    b.define(r, b.call(*t));
    return r;
  }

  Result<RuleId> compile(const json& s, const std::string& ptr, int depth) {
    if (depth > kMaxSchemaDepth)
      return Status(error(ptr, fmt::format("the schema nests deeper than {} levels", kMaxSchemaDepth)));
    if (s.is_boolean()) {
      if (!s.get<bool>()) return Status(error(ptr, "the schema false matches no value"));
      make_any();
      return value;
    }
    if (!s.is_object())
      return Status(error(ptr, fmt::format("a schema must be an object or a boolean, got {}", s.dump())));
    const std::string key = fmt::format("schema:{}:{}", static_cast<const void*>(root), s.dump());
    if (auto it = rules.find(key); it != rules.end()) return it->second;
    auto e = expr(s, ptr, depth);
    if (!e.ok()) return e.status();
    const RuleId r = b.rule(ptr.empty() ? "schema" : ptr, *e);
    rules[key] = r;
    return r;
  }

  Result<Expr> expr(const json& s, const std::string& ptr, int depth) {
    for (const auto& [k, v] : s.items()) {
      if (!kAnnotations.count(k) && !kSupported.count(k)) {
        return error(ptr + "/" + pointer_escape(k),
                     fmt::format("'{}' is not supported by constrained decoding (docs/text.md lists the JSON Schema "
                                 "subset)",
                                 k));
      }
    }
    auto others = [&](std::initializer_list<const char*> allowed) -> std::optional<std::string> {
      for (const auto& [k, v] : s.items()) {
        if (kAnnotations.count(k)) continue;
        if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; })) return k;
      }
      return std::nullopt;
    };
    const bool nullable = s.value("nullable", false) == true;
    auto with_null = [&](Expr e) { return nullable ? b.alt({e, b.literal("null")}) : e; };
    if (s.contains("const")) return with_null(b.literal(s["const"].dump()));
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) return error(ptr + "/enum", "'enum' must be a non-empty list");
      std::vector<Expr> options;
      for (const json& v : s["enum"]) options.push_back(b.literal(v.dump()));
      return with_null(b.alt(std::move(options)));
    }
    if (s.contains("$ref")) {
      if (auto k = others({"$ref", "nullable"})) {
        return error(ptr + "/" + *k, fmt::format("'{}' beside '$ref' is not supported", *k));
      }
      if (!s["$ref"].is_string()) return error(ptr + "/$ref", "'$ref' must be a string");
      auto r = resolve_ref(s["$ref"].get<std::string>(), ptr, depth);
      if (!r.ok()) return r.status();
      return with_null(b.call(*r));
    }
    for (const char* comb : {"anyOf", "oneOf", "allOf"}) {
      if (!s.contains(comb)) continue;
      if (auto k = others({comb, "nullable"})) {
        return error(ptr + "/" + *k, fmt::format("'{}' beside '{}' is not supported", *k, comb));
      }
      const json& list = s[comb];
      if (!list.is_array() || list.empty())
        return error(ptr + "/" + comb, fmt::format("'{}' must be a non-empty list", comb));
      if (std::string(comb) == "allOf" && list.size() != 1) {
        return error(ptr + "/allOf", "'allOf' with more than one schema is not supported");
      }
      std::vector<Expr> options;
      for (size_t i = 0; i < list.size(); ++i) {
        auto r = compile(list[i], fmt::format("{}/{}/{}", ptr, comb, i), depth + 1);
        if (!r.ok()) return r.status();
        options.push_back(b.call(*r));
      }
      return with_null(b.alt(std::move(options)));
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty() &&
                 std::all_of(t.begin(), t.end(), [](const json& x) { return x.is_string(); })) {
        for (const json& x : t) types.push_back(x.get<std::string>());
      } else {
        return error(ptr + "/type", "'type' must be a type name or a non-empty list of them");
      }
    } else {
      // No type: the keywords say which values they constrain; generate those.
      auto has = [&](std::initializer_list<const char*> ks) {
        return std::any_of(ks.begin(), ks.end(), [&](const char* k) { return s.contains(k); });
      };
      if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) types.push_back("number");
      if (types.empty()) {
        make_any();
        return with_null(b.call(value));
      }
    }
    if (nullable) types.push_back("null");
    std::vector<Expr> options;
    for (const std::string& t : types) {
      if (t == "string") {
        auto e = string_expr(s, ptr);
        if (!e.ok()) return e;
        options.push_back(*e);
      } else if (t == "number" || t == "integer") {
        auto e = numeric(s, ptr, t == "integer");
        if (!e.ok()) return e;
        options.push_back(*e);
      } else if (t == "boolean") {
        options.push_back(b.alt({b.literal("true"), b.literal("false")}));
      } else if (t == "null") {
        options.push_back(b.literal("null"));
      } else if (t == "object") {
        auto e = object_expr(s, ptr, depth);
        if (!e.ok()) return e;
        options.push_back(*e);
      } else if (t == "array") {
        auto e = array_expr(s, ptr, depth);
        if (!e.ok()) return e;
        options.push_back(*e);
      } else {
        return error(ptr + "/type", fmt::format("unknown type {}", json(t).dump()));
      }
    }
    return b.alt(std::move(options));
  }
};

JsonRules::JsonRules(GrammarBuilder& b, JsonGrammarOptions options) : impl_(new Impl(b, options)) {}
JsonRules::~JsonRules() { delete impl_; }

Result<RuleId> JsonRules::schema(const json& s, const std::string& where) {
  impl_->root = &s;
  impl_->where = where;
  return impl_->compile(s, "", 0);
}
RuleId JsonRules::any_value() {
  impl_->make_any();
  return impl_->value;
}
RuleId JsonRules::any_object() {
  impl_->make_any();
  return impl_->object;
}
RuleId JsonRules::any_string() { return impl_->any_string(); }
GrammarBuilder::Expr JsonRules::ws() { return impl_->ws(); }

GrammarBuilder::Expr JsonRules::json_chars(GrammarBuilder& b, char32_t lo, char32_t hi) {
  std::vector<Expr> options;
  // Raw: everything but control characters, '"' and '\'.
  const std::pair<char32_t, char32_t> raw[] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
  for (auto [a, c] : raw) {
    const char32_t l = std::max(lo, a), h = std::min(hi, c);
    if (l <= h) options.push_back(b.codepoints(l, h));
  }
  if (lo <= '"' && '"' <= hi) options.push_back(b.literal("\\\""));
  if (lo <= '\\' && '\\' <= hi) options.push_back(b.literal("\\\\"));
  for (char32_t c = lo; c <= std::min<char32_t>(hi, 0x1F); ++c) {
    switch (c) {
      case '\b':
        options.push_back(b.literal("\\b"));
        break;
      case '\f':
        options.push_back(b.literal("\\f"));
        break;
      case '\n':
        options.push_back(b.literal("\\n"));
        break;
      case '\r':
        options.push_back(b.literal("\\r"));
        break;
      case '\t':
        options.push_back(b.literal("\\t"));
        break;
      default:
        options.push_back(b.literal(fmt::format("\\u{:04x}", static_cast<uint32_t>(c))));
    }
  }
  return b.alt(std::move(options));
}

Result<Grammar> json_schema_grammar(const json& schema, const std::string& where, const JsonGrammarOptions& options) {
  GrammarBuilder b;
  JsonRules rules(b, options);
  auto root = rules.schema(schema, where);
  if (!root.ok()) return root.status();
  return b.build(*root);
}

Result<Grammar> json_object_grammar(const JsonGrammarOptions& options) {
  GrammarBuilder b;
  JsonRules rules(b, options);
  return b.build(rules.any_object());
}

}  // namespace genbridge::text::grammar
