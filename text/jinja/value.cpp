#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <variant>

#include "text/utf8.h"

namespace genbridge::text::jinja {

namespace {

// Lists and dicts are freed one at a time from a per-thread queue, never by recursion: a list nested a
// million deep (a template can build one) would otherwise overflow the stack when its last owner lets go.
thread_local std::vector<std::variant<List*, Dict*>> tl_to_free;
thread_local bool tl_freeing = false;

template <class T>
struct DeferredDelete {
  void operator()(T* p) const {
    tl_to_free.emplace_back(p);
    if (tl_freeing) return;  // the loop below, further up this thread's stack, frees it
    tl_freeing = true;
    while (!tl_to_free.empty()) {
      const std::variant<List*, Dict*> next = tl_to_free.back();
      tl_to_free.pop_back();
      std::visit([](auto* q) { delete q; }, next);
    }
    tl_freeing = false;
  }
};

thread_local ValueGuard* tl_guard = nullptr;

// Records the first limit a conversion passes; true when converting must stop.
bool guard_depth(int depth) {
  ValueGuard* g = tl_guard;
  if (!g) return false;
  if (g->tripped()) return true;
  if (depth <= g->max_depth) return false;
  g->status = resource_exhausted("a value nests deeper than " + std::to_string(g->max_depth) +
                                 " levels of lists and dicts (max_value_depth)");
  return true;
}
bool guard_bytes(size_t n) {
  ValueGuard* g = tl_guard;
  if (!g) return false;
  if (g->tripped()) return true;
  if (n <= g->max_bytes) return false;
  g->status = resource_exhausted("a string would exceed " + std::to_string(g->max_bytes) + " bytes (max_output_bytes)");
  return true;
}

// Remembers a container made under the guard; expired entries are dropped whenever the list doubles.
template <class T>
void remember(std::vector<std::weak_ptr<T>>& made, const std::shared_ptr<T>& p) {
  if (made.size() == made.capacity() && made.size() >= 64) {
    std::erase_if(made, [](const std::weak_ptr<T>& w) { return w.expired(); });
  }
  made.push_back(p);
}

}  // namespace

void ValueGuard::empty_survivors() {
  for (const std::weak_ptr<List>& w : made_lists) {
    if (const std::shared_ptr<List> l = w.lock()) List().swap(*l);
  }
  for (const std::weak_ptr<Dict>& w : made_dicts) {
    if (const std::shared_ptr<Dict> d = w.lock()) decltype(d->items)().swap(d->items);
  }
  made_lists.clear();
  made_dicts.clear();
}

ValueGuard* ValueGuard::current() { return tl_guard; }
ValueGuard::Scope::Scope(ValueGuard* g) : prev_(tl_guard) { tl_guard = g; }
ValueGuard::Scope::~Scope() { tl_guard = prev_; }

Value Value::new_list(List items) {
  Value x = with_kind(Kind::kList);
  x.list = std::shared_ptr<List>(new List(std::move(items)), DeferredDelete<List>{});
  if (tl_guard) remember(tl_guard->made_lists, x.list);
  return x;
}
Value Value::new_dict() {
  Value x = with_kind(Kind::kDict);
  x.dict = std::shared_ptr<Dict>(new Dict(), DeferredDelete<Dict>{});
  if (tl_guard) remember(tl_guard->made_dicts, x.dict);
  return x;
}
Value Value::new_namespace() {
  Value x = with_kind(Kind::kNamespace);
  x.dict = std::shared_ptr<Dict>(new Dict(), DeferredDelete<Dict>{});
  if (tl_guard) remember(tl_guard->made_dicts, x.dict);
  return x;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(std::string key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(v));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kMacro:
      return true;
  }
  return false;
}

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      const int64_t x = a.kind == Value::Kind::kBool ? a.b : a.i, y = b.kind == Value::Kind::kBool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      if (guard_depth(depth + 1)) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!equal_at((*a.list)[i], (*b.list)[i], depth + 1)) return false;
      }
      return true;
    case Value::Kind::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      if (guard_depth(depth + 1)) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equal_at(v, *o, depth + 1)) return false;
      }
      return true;
    default:
      return a.dict == b.dict && a.macro == b.macro;
  }
}

}  // namespace

bool equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kMacro:
      return "Macro";
  }
  return "?";
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for exponents in [-4, 16), else scientific.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

namespace {

std::string repr_string(const std::string& s) {
  // Python picks single quotes unless the string holds ' and no ".
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

Status json_value(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  const auto newline = [&](int d) {
    if (indent < 0) return;
    const size_t pad = static_cast<size_t>(indent) * static_cast<size_t>(d);
    if (guard_bytes(out.size() + 1 + pad)) return;
    out += '\n';
    out.append(pad, ' ');
  };
  if (guard_bytes(out.size())) return tl_guard->status;
  if ((v.kind == Value::Kind::kList || v.is_mapping()) && guard_depth(depth + 1)) return tl_guard->status;
  const char* sep = indent >= 0 ? "," : ", ";
  switch (v.kind) {
    case Value::Kind::kNone:
      out += "null";
      return ok_status();
    case Value::Kind::kBool:
      out += v.b ? "true" : "false";
      return ok_status();
    case Value::Kind::kInt:
      out += std::to_string(v.i);
      return ok_status();
    case Value::Kind::kFloat:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(v.f);
      }
      return ok_status();
    case Value::Kind::kString:
      json_string(out, v.s);
      return ok_status();
    case Value::Kind::kList:
      out += '[';
      if (v.list->empty()) return out += ']', ok_status();
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += sep;
        newline(depth + 1);
        GB_RETURN_IF_ERROR(json_value(out, (*v.list)[i], indent, sort_keys, depth + 1));
        if (tl_guard && tl_guard->tripped()) return tl_guard->status;
      }
      newline(depth);
      out += ']';
      return ok_status();
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      out += '{';
      if (v.dict->items.empty()) return out += '}', ok_status();
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += sep;
        newline(depth + 1);
        json_string(out, items[i]->first);
        out += ": ";
        GB_RETURN_IF_ERROR(json_value(out, items[i]->second, indent, sort_keys, depth + 1));
        if (tl_guard && tl_guard->tripped()) return tl_guard->status;
      }
      newline(depth);
      out += '}';
      return ok_status();
    }
    default:
      return invalid_argument(std::string("tojson: a value of type ") + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

namespace {

void repr_into(std::string& out, const Value& v, int depth) {
  if (guard_bytes(out.size())) return;
  switch (v.kind) {
    case Value::Kind::kString:
      out += repr_string(v.s);
      return;
    case Value::Kind::kList:
      if (guard_depth(depth + 1)) return;
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        repr_into(out, (*v.list)[i], depth + 1);
        if (guard_bytes(out.size())) return;
      }
      out += ']';
      return;
    case Value::Kind::kDict:
      if (guard_depth(depth + 1)) return;
      out += '{';
      for (size_t i = 0; i < v.dict->items.size(); ++i) {
        if (i) out += ", ";
        out += repr_string(v.dict->items[i].first) + ": ";
        repr_into(out, v.dict->items[i].second, depth + 1);
        if (guard_bytes(out.size())) return;
      }
      out += '}';
      return;
    default:
      out += to_output(v);
  }
}

}  // namespace

std::string repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

std::string to_output(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return float_repr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return repr(v);
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kMacro:
      return "<Macro>";
  }
  return "";
}

Result<std::string> to_json_text(const Value& v, int indent, bool sort_keys) {
  std::string out;
  GB_RETURN_IF_ERROR(json_value(out, v, indent, sort_keys, 0));
  return out;
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value l = Value::new_list();
      for (const auto& e : j) l.list->push_back(from_json_at(e));
      return l;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::new_dict();
      for (const auto& [k, e] : j.items()) d.dict->items.emplace_back(k, from_json_at(e));
      return d;
    }
    default:
      return Value();
  }
}

}  // namespace

bool json_deeper_than(const nlohmann::ordered_json& j, int max_depth) {
  std::vector<std::pair<const nlohmann::ordered_json*, int>> stack{{&j, 0}};
  while (!stack.empty()) {
    const auto [x, d] = stack.back();
    stack.pop_back();
    if (!x->is_structured()) continue;
    if (d + 1 > max_depth) return true;
    for (const auto& e : *x) stack.emplace_back(&e, d + 1);
  }
  return false;
}

Result<Value> from_json(const nlohmann::ordered_json& j, int max_depth) {
  if (json_deeper_than(j, max_depth)) {
    std::string where = "$";
    if (j.is_object()) {
      for (const auto& [k, e] : j.items()) {
        if (json_deeper_than(e, max_depth - 1)) {
          where += "." + k;
          break;
        }
      }
    }
    return invalid_argument("chat template: the value at " + where + " nests deeper than " + std::to_string(max_depth) +
                            " levels of lists and dicts (max_value_depth)");
  }
  return from_json_at(j);
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (size_t pos = 0; pos < s.size(); ++n) {
    const Utf8Step st = utf8_step(s, pos);
    pos += st.length == 0 ? 1 : st.length;
  }
  return n;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Step st = utf8_step(s, pos);
    const size_t n = st.length == 0 ? 1 : st.length;
    out.push_back(s.substr(pos, n));
    pos += n;
  }
  return out;
}

}  // namespace genbridge::text::jinja
