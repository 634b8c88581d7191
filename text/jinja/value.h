#pragma once
// Internal: the values a chat template computes with (Python/Jinja2 semantics: None, bool, int, float,
// str, list, dict with insertion order, namespace, macro). Lists, dicts and namespaces are shared by
// reference, as in Python.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::text::jinja {

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Macro;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kMacro };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // kDict and kNamespace
  std::shared_ptr<const Macro> macro;

  static Value none() { return with_kind(Kind::kNone); }
  static Value boolean(bool v) {
    Value x = with_kind(Kind::kBool);
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x = with_kind(Kind::kInt);
    x.i = v;
    return x;
  }
  static Value number(double v) {
    Value x = with_kind(Kind::kFloat);
    x.f = v;
    return x;
  }
  static Value string(std::string v) {
    Value x = with_kind(Kind::kString);
    x.s = std::move(v);
    return x;
  }
  static Value new_list(List items = {});
  static Value new_dict();
  static Value new_namespace();

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_mapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
  double as_double() const {
    return kind == Kind::kFloat ? f : kind == Kind::kBool ? (b ? 1 : 0) : static_cast<double>(i);
  }

 private:
  static Value with_kind(Kind k) {
    Value x;
    x.kind = k;
    return x;
  }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(std::string key, Value v);
};

// Bounds for the recursive conversions and comparisons below while a render runs (docs/text.md "Limits"): a
// value nested deeper than max_depth, or text longer than max_bytes, stops the conversion (its result is then
// partial) and records the first such error in `status`, which the renderer reports after the expression.
// Installed for the current thread by ValueGuard::Scope; without one nothing is bounded.
struct ValueGuard {
  int max_depth = 256;
  size_t max_bytes = SIZE_MAX;
  Status status;
  bool tripped() const { return !status.ok(); }
  // The lists and dicts made while this guard is installed; empty_survivors() empties those still alive.
  std::vector<std::weak_ptr<List>> made_lists;
  std::vector<std::weak_ptr<Dict>> made_dicts;
  void empty_survivors();
  // The guard of the current thread, or nullptr.
  static ValueGuard* current();
  class Scope {
   public:
    explicit Scope(ValueGuard* g);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ValueGuard* prev_;
  };
};

// Python's truthiness.
bool truthy(const Value& v);
// Python's ==.
bool equal(const Value& a, const Value& b);
// The type name Jinja2 uses in messages ("str", "int", "list", "dict", "NoneType", "undefined", ...).
const char* type_name(const Value& v);

// {{ v }}: str(v) in Python (None -> "None", True -> "True", 2.0 -> "2.0", lists and dicts as repr), and
// "" for undefined.
std::string to_output(const Value& v);
// repr(v) in Python: strings quoted with '...'.
std::string repr(const Value& v);
// Python's repr of a float ("2.0", "0.1", "1e+20", "inf").
std::string float_repr(double v);

// transformers' tojson: json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys); separators
// ", " and ": " without indent, "," and ": " with it. InvalidArgument for undefined values and macros.
Result<std::string> to_json_text(const Value& v, int indent, bool sort_keys);

// A JSON document as values (objects keep their key order). InvalidArgument when arrays and objects nest
// deeper than `max_depth`, naming the limit and the top-level key it is under.
Result<Value> from_json(const nlohmann::ordered_json& j, int max_depth);
// Whether `j`'s arrays and objects nest deeper than `max_depth` (an iterative walk: safe on any depth).
bool json_deeper_than(const nlohmann::ordered_json& j, int max_depth);

// Python string helpers on UTF-8: code points, not bytes, are the unit of len() and indexing.
std::vector<std::string_view> code_points(std::string_view s);
size_t count_code_points(std::string_view s);

}  // namespace genbridge::text::jinja
