// Rendering: a tree-walking interpreter with Jinja2's (Python's) semantics for the subset parse.cpp accepts.
#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <optional>

#include "text/jinja/template.h"
#include "text/utf8.h"

namespace genbridge::text::jinja {
namespace {

constexpr int kMaxMacroDepth = 64;
constexpr int64_t kEntryBytes = RenderLimits::kEntryBytes;

std::string at_line(int line, const std::string& what) {
  return "chat template line " + std::to_string(line) + ": " + what;
}
Status error_at(int line, const std::string& what) { return invalid_argument(at_line(line, what)); }
Status limit_at(int line, const std::string& what) { return resource_exhausted(at_line(line, what)); }

bool py_space(char32_t cp) { return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

std::string map_case(std::string_view s, bool upper) {
  std::string out;
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Step st = utf8_step(s, pos);
    if (st.kind != Utf8Step::Kind::kValid) {
      out += s[pos++];
      continue;
    }
    const auto cp = static_cast<utf8proc_int32_t>(st.code_point);
    append_utf8(out, static_cast<char32_t>(upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp)));
    pos += st.length;
  }
  return out;
}

// Python's str.strip family. `chars` null: whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<std::string_view> cps = code_points(s);
  std::vector<std::string_view> set;
  if (chars) set = code_points(*chars);
  const auto strip_it = [&](std::string_view c) {
    if (!chars) {
      size_t p = 0;
      const Utf8Step st = utf8_step(c, 0);
      (void)p;
      return st.kind == Utf8Step::Kind::kValid && py_space(st.code_point);
    }
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip_it(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip_it(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i];
  return out;
}

// Python's str.split(sep=None, maxsplit=-1). Stops after `max_items` + 1 parts (the caller refuses that many).
Value py_split(std::string_view s, const Value* sep, int64_t maxsplit, size_t max_items) {
  Value out = Value::new_list();
  if (!sep || sep->is_none()) {
    std::vector<std::string_view> cps = code_points(s);
    size_t i = 0;
    const auto space = [&](size_t k) {
      const Utf8Step st = utf8_step(cps[k], 0);
      return st.kind == Utf8Step::Kind::kValid && py_space(st.code_point);
    };
    while (i < cps.size()) {
      while (i < cps.size() && space(i)) ++i;
      if (i >= cps.size()) break;
      std::string word;
      if (maxsplit >= 0 && static_cast<int64_t>(out.list->size()) == maxsplit) {
        for (; i < cps.size(); ++i) word += cps[i];
        // Python strips trailing whitespace of the remainder only when it splits it off; keep it as is.
        out.list->push_back(Value::string(word));
        break;
      }
      while (i < cps.size() && !space(i)) word += cps[i++];
      out.list->push_back(Value::string(word));
      if (out.list->size() > max_items) break;
    }
    return out;
  }
  const std::string& d = sep->s;
  size_t start = 0;
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.list->size()) == maxsplit) break;
    const size_t p = s.find(d, start);
    if (p == std::string_view::npos) break;
    out.list->push_back(Value::string(std::string(s.substr(start, p - start))));
    start = p + d.size();
    if (out.list->size() > max_items) return out;
  }
  out.list->push_back(Value::string(std::string(s.substr(start))));
  return out;
}

// Stops once the result passes `cap` bytes (the caller refuses such a result).
std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count,
                       size_t cap) {
  if (old.empty()) {
    // Python inserts `rep` between every character (and at both ends).
    std::string out = rep;
    int64_t n = 1;
    for (std::string_view c : code_points(s)) {
      out += c;
      if (count < 0 || n < count) out += rep, ++n;
      if (out.size() > cap) break;
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  for (size_t p = s.find(old); p != std::string::npos && (count < 0 || n < count); p = s.find(old, start)) {
    out.append(s, start, p - start);
    out += rep;
    start = p + old.size();
    ++n;
    if (out.size() > cap) return out;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string title_case(std::string_view s, bool capitalize_only) {
  std::string out;
  bool prev_cased = false;
  bool first = true;
  for (std::string_view c : code_points(s)) {
    const Utf8Step st = utf8_step(c, 0);
    const bool letter = st.kind == Utf8Step::Kind::kValid &&
                        utf8proc_category(static_cast<utf8proc_int32_t>(st.code_point)) >= UTF8PROC_CATEGORY_LU &&
                        utf8proc_category(static_cast<utf8proc_int32_t>(st.code_point)) <= UTF8PROC_CATEGORY_LO;
    const bool up = capitalize_only ? first : (letter && !prev_cased);
    out += map_case(c, up);
    prev_cased = letter;
    first = false;
  }
  return out;
}

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument at `index` or named `name`, or nullptr.
  const Value* get(size_t index, std::string_view name) const {
    for (const auto& [k, v] : kw) {
      if (k == name) return &v;
    }
    return index < pos.size() ? &pos[index] : nullptr;
  }
};

// range()'s integers, computed as they are needed (a loop over range(n) never holds n values).
struct Range {
  int64_t start = 0, step = 1, count = 0;
  Value at(int64_t i) const { return Value::integer(start + i * step); }
};

class Renderer {
 public:
  Renderer(const Value& context, const RenderLimits& limits) : limits_(limits), guard_scope_(&guard_) {
    guard_.max_depth = limits.max_value_depth;
    guard_.max_bytes = static_cast<size_t>(std::max<int64_t>(limits.max_output_bytes, 0));
    scopes_.emplace_back();
    if (context.is_mapping()) {
      for (const auto& [k, v] : context.dict->items) scopes_.back()[k] = v;
    }
    frames_.push_back(0);
  }
  // Lists and dicts the template made that outlive its variables hold each other (`l.append(l)`): emptied here,
  // or they would never be freed.
  ~Renderer() {
    scopes_.clear();
    guard_.empty_survivors();
  }
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  Status render(const Body& body, std::string& out) {
    for (const NodePtr& n : body) {
      GB_RETURN_IF_ERROR(render_node_bounded(*n, out));
      if (control_ != Control::kNone) return ok_status();
    }
    return ok_status();
  }

 private:
  enum class Control { kNone, kBreak, kContinue };
  using Scope = std::map<std::string, Value, std::less<>>;

  // ---- the budget (RenderLimits) ----

  // One step when it needs no check (the hot path: no Status made); false: call step() instead.
  bool tick() {
    if (steps_ + 1 >= next_poll_ || steps_ >= limits_.max_steps) return false;
    ++steps_;
    return true;
  }
  // Counts `n` steps; past max_steps an error, and every kPollSteps the deadline and the cancel flag.
  Status step(int line, int64_t n = 1) {
    if (n > limits_.max_steps - steps_) {
      return limit_at(line, "the render takes more than " + std::to_string(limits_.max_steps) +
                                " steps (max_steps: statements, expressions, loop iterations and items walked)");
    }
    steps_ += n;
    if (steps_ < next_poll_) return ok_status();
    next_poll_ = steps_ + RenderLimits::kPollSteps;
    if (std::chrono::steady_clock::now() >= limits_.deadline) {
      return deadline_exceeded(
          at_line(line, "the render passed its deadline after " + std::to_string(steps_) + " steps"));
    }
    if (limits_.cancelled && limits_.cancelled()) {
      return unavailable(at_line(line, "the render was cancelled after " + std::to_string(steps_) + " steps"));
    }
    return ok_status();
  }
  // Counts `bytes` the render builds; past max_built_bytes an error.
  Status build(int line, int64_t bytes) {
    if (bytes > limits_.max_built_bytes - built_) return built_error(line);
    built_ += bytes;
    return ok_status();
  }
  [[gnu::noinline]] Status built_error(int line) const {
    return limit_at(line, "the render builds more than " + std::to_string(limits_.max_built_bytes) +
                              " bytes of strings, lists and dicts (max_built_bytes)");
  }
  // Whether `bytes` more (of strings, or list entries at kEntryBytes) fit max_built_bytes, without counting.
  bool fits_built(int64_t bytes) const { return bytes <= limits_.max_built_bytes - built_; }
  Status string_fits(int line, size_t n) {
    if (n <= static_cast<size_t>(limits_.max_output_bytes)) return ok_status();
    return string_error(line);
  }
  [[gnu::noinline]] Status string_error(int line) const {
    return limit_at(line,
                    "a string would exceed " + std::to_string(limits_.max_output_bytes) + " bytes (max_output_bytes)");
  }
  // A value conversion or comparison stopped at a limit (ValueGuard): its error, at `line`.
  Status guard_status(int line) {
    if (!guard_.tripped()) return ok_status();
    return limit_at(line, guard_.status.message());
  }
  // What a list or dict built just now costs: kEntryBytes per entry and the bytes of its strings.
  static int64_t container_bytes(const Value& v) {
    int64_t n = 0;
    const auto entry = [&](const Value& x) {
      n += kEntryBytes + (x.is_string() ? static_cast<int64_t>(x.s.size()) : 0);
    };
    if (v.kind == Value::Kind::kList) {
      for (const Value& x : *v.list) entry(x);
    } else if (v.is_mapping()) {
      for (const auto& [k, x] : v.dict->items) {
        entry(x);
        n += static_cast<int64_t>(k.size());
      }
    }
    return n;
  }
  // Whether an expression's result adds to the budget (account()): a new string, or a list / dict no other
  // value holds yet; and any result once a value conversion stopped at a limit.
  bool accountable(const Expr& e, const Value& v) const {
    if (guard_.tripped()) return true;
    switch (e.kind) {
      case Expr::Kind::kLiteral:
      case Expr::Kind::kName:
      case Expr::Kind::kAttr:
      case Expr::Kind::kIndex:
      case Expr::Kind::kCond:
        return false;  // a value that exists already (a string copy is bounded by the one it copies)
      default:
        break;
    }
    return v.is_string() || (v.kind == Value::Kind::kList && v.list.use_count() == 1) ||
           (v.is_mapping() && v.dict.use_count() == 1);
  }
  Status account(const Expr& e, const Value& v) {
    GB_RETURN_IF_ERROR(guard_status(e.line));
    if (v.is_string()) {
      GB_RETURN_IF_ERROR(string_fits(e.line, v.s.size()));
      return build(e.line, static_cast<int64_t>(v.s.size()));
    }
    if (v.kind == Value::Kind::kList && v.list.use_count() == 1) return build(e.line, container_bytes(v));
    if (v.is_mapping() && v.dict.use_count() == 1) return build(e.line, container_bytes(v));
    return ok_status();
  }
  Status append_output(int line, std::string& out, std::string_view text) {
    const auto n = static_cast<int64_t>(text.size());
    if (n <= limits_.max_output_bytes - static_cast<int64_t>(out.size()) && n <= limits_.max_built_bytes - built_) {
      built_ += n;
      out += text;
      return ok_status();
    }
    if (text.size() > static_cast<size_t>(limits_.max_output_bytes) - out.size()) {
      return limit_at(line, "the rendered text would exceed " + std::to_string(limits_.max_output_bytes) +
                                " bytes (max_output_bytes)");
    }
    GB_RETURN_IF_ERROR(build(line, static_cast<int64_t>(text.size())));
    out += text;
    return ok_status();
  }
  Status enter(int line) {
    if (depth_ >= limits_.max_render_depth) {
      return limit_at(line, "the render nests deeper than " + std::to_string(limits_.max_render_depth) +
                                " levels (max_render_depth: blocks, expressions and macro calls together)");
    }
    ++depth_;
    return ok_status();
  }

  Status render_node_bounded(const Node& n, std::string& out) {
    if (!tick()) GB_RETURN_IF_ERROR(step(n.line));
    if (depth_ >= limits_.max_render_depth) return enter(n.line);
    ++depth_;
    Status st = render_node(n, out);
    --depth_;
    return st;
  }

  const Value* lookup(std::string_view name) const {
    for (size_t i = scopes_.size(); i-- > frames_.back();) {
      if (const auto it = scopes_[i].find(name); it != scopes_[i].end()) return &it->second;
    }
    if (frames_.back() > 0) {  // inside a macro: the template's globals are visible too
      if (const auto it = scopes_[0].find(name); it != scopes_[0].end()) return &it->second;
    }
    return nullptr;
  }

  Status render_node(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::kText:
        return append_output(n.line, out, n.text);
      case Node::Kind::kOutput: {
        GB_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        if (v.is_string()) return append_output(n.line, out, v.s);
        const std::string text = to_output(v);
        GB_RETURN_IF_ERROR(guard_status(n.line));
        return append_output(n.line, out, text);
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          GB_ASSIGN_OR_RETURN(Value c, eval(*cond));
          if (truthy(c)) return render(body, out);
        }
        return render(n.else_body, out);
      case Node::Kind::kFor:
        return render_for(n, out);
      case Node::Kind::kSet: {
        GB_ASSIGN_OR_RETURN(Value v, eval(*n.expr));
        return assign(n, std::move(v));
      }
      case Node::Kind::kSetBlock: {
        std::string text;
        GB_RETURN_IF_ERROR(render(n.body, text));
        scopes_.back()[n.targets[0]] = Value::string(std::move(text));
        return ok_status();
      }
      case Node::Kind::kMacro: {
        Value m;
        m.kind = Value::Kind::kMacro;
        m.macro = std::make_shared<Macro>(Macro{&n});
        scopes_.back()[n.name] = std::move(m);
        return ok_status();
      }
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loop_depth_ == 0) return error_at(n.line, "'break' or 'continue' outside a loop");
        control_ = n.kind == Node::Kind::kBreak ? Control::kBreak : Control::kContinue;
        return ok_status();
      default:
        return error_at(n.line, "internal: unknown node");
    }
  }

  Status assign(const Node& n, Value v) {
    if (!n.attr.empty()) {
      const Value* ns = lookup(n.targets[0]);
      if (!ns || ns->kind != Value::Kind::kNamespace) {
        return error_at(
            n.line, "'{% set " + n.targets[0] + "." + n.attr + " %}' needs '" + n.targets[0] + "' to be a namespace()");
      }
      ns->dict->set(n.attr, std::move(v));
      return ok_status();
    }
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(v);
      return ok_status();
    }
    GB_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v, n.line));
    if (items.size() != n.targets.size()) {
      return error_at(n.line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                                  std::to_string(n.targets.size()) + " names");
    }
    for (size_t i = 0; i < items.size(); ++i) scopes_.back()[n.targets[i]] = items[i];
    return ok_status();
  }

  // The items of a loop or a filter over a sequence; each counts a step, and the characters of a string (made
  // into values here) count kEntryBytes each as well.
  Result<std::vector<Value>> iterate(const Value& v, int line) {
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return std::vector<Value>{};
      case Value::Kind::kList:
        GB_RETURN_IF_ERROR(step(line, static_cast<int64_t>(v.list->size())));
        return *v.list;
      case Value::Kind::kDict: {
        GB_RETURN_IF_ERROR(step(line, static_cast<int64_t>(v.dict->items.size())));
        std::vector<Value> keys;
        for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
        return keys;
      }
      case Value::Kind::kString: {
        const auto n = static_cast<int64_t>(count_code_points(v.s));
        GB_RETURN_IF_ERROR(step(line, n));
        GB_RETURN_IF_ERROR(build(line, n * kEntryBytes));
        std::vector<Value> chars;
        chars.reserve(static_cast<size_t>(n));
        for (std::string_view c : code_points(v.s)) chars.push_back(Value::string(std::string(c)));
        return chars;
      }
      default:
        return error_at(line, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  // A loop's iterable written as a call of the range() global: its integers, never built as a list.
  Result<std::optional<Range>> loop_range(const Expr& e) {
    if (e.kind != Expr::Kind::kCall || e.args[0]->kind != Expr::Kind::kName || e.args[0]->name != "range")
      return std::optional<Range>();
    if (const Value* v = lookup("range"); v && v->kind == Value::Kind::kMacro) return std::optional<Range>();
    GB_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    GB_ASSIGN_OR_RETURN(Range r, range_args(a, e.line));
    return std::optional<Range>(r);
  }

  Status render_for(const Node& n, std::string& out) {
    GB_ASSIGN_OR_RETURN(std::optional<Range> range, loop_range(*n.expr));
    std::vector<Value> all;
    if (!range) {
      GB_ASSIGN_OR_RETURN(Value seq, eval(*n.expr));
      GB_ASSIGN_OR_RETURN(all, iterate(seq, n.line));
    }
    const auto bind = [&](Scope& scope, const Value& item) -> Status {
      if (n.targets.size() == 1) {
        scope[n.targets[0]] = item;
        return ok_status();
      }
      GB_ASSIGN_OR_RETURN(std::vector<Value> parts, iterate(item, n.line));
      if (parts.size() != n.targets.size()) {
        return error_at(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                                    std::to_string(n.targets.size()) + " loop variables");
      }
      for (size_t i = 0; i < parts.size(); ++i) scope[n.targets[i]] = parts[i];
      return ok_status();
    };
    std::vector<Value> items;
    const int64_t total = range ? range->count : static_cast<int64_t>(all.size());
    if (n.filter) {
      for (int64_t i = 0; i < total; ++i) {
        const Value item = range ? range->at(i) : all[static_cast<size_t>(i)];
        scopes_.emplace_back();
        Status st = bind(scopes_.back(), item);
        Result<Value> keep = st.ok() ? eval(*n.filter) : Result<Value>(st);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (truthy(*keep)) {
          GB_RETURN_IF_ERROR(build(n.line, kEntryBytes));
          items.push_back(item);
        }
      }
      range.reset();
    } else {
      items = std::move(all);
    }
    const int64_t len = range ? range->count : static_cast<int64_t>(items.size());
    const auto item_at = [&](int64_t i) { return range ? range->at(i) : items[static_cast<size_t>(i)]; };
    if (len == 0) return render(n.else_body, out);
    ++loop_depth_;
    for (int64_t i = 0; i < len; ++i) {
      if (Status st = tick() ? Status() : step(n.line); !st.ok()) {
        --loop_depth_;
        return st;
      }
      scopes_.emplace_back();
      Value loop = Value::new_dict();
      Dict& d = *loop.dict;
      d.set("index", Value::integer(i + 1));
      d.set("index0", Value::integer(i));
      d.set("revindex", Value::integer(len - i));
      d.set("revindex0", Value::integer(len - i - 1));
      d.set("first", Value::boolean(i == 0));
      d.set("last", Value::boolean(i == len - 1));
      d.set("length", Value::integer(len));
      d.set("previtem", i > 0 ? item_at(i - 1) : Value());
      d.set("nextitem", i + 1 < len ? item_at(i + 1) : Value());
      scopes_.back()["loop"] = loop;
      Status st = range ? bind(scopes_.back(), range->at(i)) : bind(scopes_.back(), items[static_cast<size_t>(i)]);
      if (st.ok()) st = render(n.body, out);
      scopes_.pop_back();
      if (!st.ok()) {
        --loop_depth_;
        return st;
      }
      const Control c = control_;
      control_ = Control::kNone;
      if (c == Control::kBreak) break;
    }
    --loop_depth_;
    return ok_status();
  }

  Result<Args> eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) {
      GB_ASSIGN_OR_RETURN(Value v, eval(*e.args[i]));
      a.pos.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      GB_ASSIGN_OR_RETURN(Value v, eval(*x));
      a.kw.emplace_back(k, std::move(v));
    }
    return a;
  }

  // Evaluates with the budget's checks. One return of one named result (no copy of the value on the way out:
  // a Value is large, and this runs for every expression).
  Result<Value> eval(const Expr& e) {
    Status admitted = tick() ? Status() : step(e.line);
    if (admitted.ok() && depth_ >= limits_.max_render_depth) admitted = enter(e.line);
    Result<Value> r = admitted.ok() ? eval_nested(e) : Result<Value>(std::move(admitted));
    if (r.ok() && accountable(e, *r)) {
      if (Status st = account(e, *r); !st.ok()) r = Result<Value>(std::move(st));
    }
    return r;
  }
  Result<Value> eval_nested(const Expr& e) {
    struct Level {
      int& depth;
      ~Level() { --depth; }
    } level{++depth_};
    return eval_unbounded(e);
  }

  Result<Value> eval_unbounded(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        const Value* v = lookup(e.name);
        return v ? *v : Value();
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Value l = Value::new_list();
        for (const ExprPtr& x : e.args) {
          GB_ASSIGN_OR_RETURN(Value v, eval(*x));
          l.list->push_back(std::move(v));
        }
        return l;
      }
      case Expr::Kind::kDict: {
        Value d = Value::new_dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          GB_ASSIGN_OR_RETURN(Value k, eval(*e.args[i]));
          GB_ASSIGN_OR_RETURN(Value v, eval(*e.args[i + 1]));
          if (!k.is_string()) return error_at(e.line, "dictionary keys must be strings here");
          d.dict->set(k.s, std::move(v));
        }
        return d;
      }
      case Expr::Kind::kAttr: {
        GB_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
        if (obj.is_undefined()) return error_at(e.line, "cannot read attribute '" + e.name + "' of an undefined value");
        if (obj.is_mapping()) {
          const Value* v = obj.dict->find(e.name);
          return v ? *v : Value();
        }
        return Value();
      }
      case Expr::Kind::kIndex: {
        GB_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
        GB_ASSIGN_OR_RETURN(Value key, eval(*e.args[1]));
        return index(obj, key, e.line);
      }
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter: {
        GB_ASSIGN_OR_RETURN(Value subject, eval(*e.args[0]));
        GB_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
        return filter(e.name, subject, a, e.line);
      }
      case Expr::Kind::kTest: {
        GB_ASSIGN_OR_RETURN(Value subject, eval(*e.args[0]));
        GB_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
        GB_ASSIGN_OR_RETURN(bool r, test(e.name, subject, a, e.line));
        return Value::boolean(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        GB_ASSIGN_OR_RETURN(Value v, eval(*e.args[0]));
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (!v.is_number())
          return error_at(e.line, std::string("bad operand type for unary ") + e.name + ": '" + type_name(v) + "'");
        if (e.name == "+") return v;
        return v.kind == Value::Kind::kFloat ? Value::number(-v.f)
                                             : Value::integer(-(v.kind == Value::Kind::kBool ? v.b : v.i));
      }
      case Expr::Kind::kBinary:
        return binary(e);
      case Expr::Kind::kCond: {
        GB_ASSIGN_OR_RETURN(Value c, eval(*e.args[0]));
        if (truthy(c)) return eval(*e.args[1]);
        if (!e.args[2]) return Value();
        return eval(*e.args[2]);
      }
    }
    return error_at(e.line, "internal: unknown expression");
  }

  Result<Value> index(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) return error_at(line, "cannot index an undefined value");
    if (obj.is_mapping()) {
      if (!key.is_string()) return Value();
      const Value* v = obj.dict->find(key.s);
      return v ? *v : Value();
    }
    if ((obj.kind == Value::Kind::kList || obj.is_string()) &&
        (key.kind == Value::Kind::kInt || key.kind == Value::Kind::kBool)) {
      const int64_t n =
          obj.is_string() ? static_cast<int64_t>(count_code_points(obj.s)) : static_cast<int64_t>(obj.list->size());
      int64_t i = key.kind == Value::Kind::kBool ? key.b : key.i;
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();  // Jinja2: an undefined value, not an error
      if (!obj.is_string()) return (*obj.list)[static_cast<size_t>(i)];
      size_t pos = 0;
      for (int64_t k = 0; k < i; ++k) pos += std::max<size_t>(utf8_step(obj.s, pos).length, 1);
      return Value::string(obj.s.substr(pos, std::max<size_t>(utf8_step(obj.s, pos).length, 1)));
    }
    return Value();
  }

  Result<Value> slice(const Expr& e) {
    GB_ASSIGN_OR_RETURN(Value obj, eval(*e.args[0]));
    int64_t part[3] = {0, 0, 1};
    bool given[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      GB_ASSIGN_OR_RETURN(Value v, eval(*e.args[k + 1]));
      if (v.is_none()) continue;
      if (v.kind != Value::Kind::kInt) return error_at(e.line, "slice indices must be integers");
      part[k] = v.i;
      given[k] = true;
    }
    const int64_t step = part[2];
    if (step == 0) return error_at(e.line, "slice step cannot be zero");
    std::vector<Value> items;
    std::vector<std::string_view> cps;
    int64_t n;
    if (obj.is_string() && step == 1) {
      n = static_cast<int64_t>(count_code_points(obj.s));
    } else if (obj.is_string()) {
      cps = code_points(obj.s);
      n = static_cast<int64_t>(cps.size());
    } else if (obj.kind == Value::Kind::kList) {
      n = static_cast<int64_t>(obj.list->size());
    } else {
      return error_at(e.line, std::string("'") + type_name(obj) + "' object is not subscriptable with a slice");
    }
    const auto clamp = [&](int64_t v, bool is_given, int64_t def_pos, int64_t def_neg) {
      if (!is_given) return step > 0 ? def_pos : def_neg;
      if (v < 0) v += n;
      if (step > 0) return std::clamp<int64_t>(v, 0, n);
      return std::clamp<int64_t>(v, -1, n - 1);
    };
    const int64_t start = clamp(part[0], given[0], 0, n - 1);
    const int64_t stop = clamp(part[1], given[1], n, -1);
    if (obj.is_string() && step == 1) {  // by byte offsets: no list of the string's characters
      const auto offset = [&](int64_t cp, size_t from_pos, int64_t from_cp) {
        for (; from_cp < cp; ++from_cp) from_pos += std::max<size_t>(utf8_step(obj.s, from_pos).length, 1);
        return from_pos;
      };
      if (stop <= start) return Value::string("");
      const size_t b = offset(start, 0, 0);
      return Value::string(obj.s.substr(b, offset(stop, b, start) - b));
    }
    std::string s;
    Value l = Value::new_list();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.is_string()) {
        s += cps[i];
      } else {
        l.list->push_back((*obj.list)[i]);
      }
    }
    return obj.is_string() ? Value::string(s) : l;
  }

  Result<Value> call(const Expr& e) {
    const Expr& callee = *e.args[0];
    GB_ASSIGN_OR_RETURN(Args a, eval_args(e, 1));
    if (callee.kind == Expr::Kind::kAttr) {
      GB_ASSIGN_OR_RETURN(Value obj, eval(*callee.args[0]));
      return method(obj, callee.name, a, e.line);
    }
    if (callee.kind == Expr::Kind::kName) {
      const Value* v = lookup(callee.name);
      if (v && v->kind == Value::Kind::kMacro) return call_macro(*v->macro, a, e.line);
      return global(callee.name, a, e.line);
    }
    GB_ASSIGN_OR_RETURN(Value f, eval(callee));
    if (f.kind == Value::Kind::kMacro) return call_macro(*f.macro, a, e.line);
    return error_at(e.line, std::string("'") + type_name(f) + "' object is not callable");
  }

  Result<Value> call_macro(const Macro& m, const Args& a, int line) {
    const Node& n = *m.node;
    if (a.pos.size() > n.params.size()) {
      return error_at(line, "macro '" + n.name + "' takes " + std::to_string(n.params.size()) + " arguments, " +
                                std::to_string(a.pos.size()) + " given");
    }
    if (macro_depth_ >= kMaxMacroDepth)
      return error_at(line, "macros nest deeper than " + std::to_string(kMaxMacroDepth));
    Scope frame;
    for (size_t i = 0; i < n.params.size(); ++i) {
      const auto& [name, def] = n.params[i];
      if (const Value* v = a.get(a.pos.size() > i ? i : SIZE_MAX, name)) {
        frame[name] = *v;
      } else if (def) {
        GB_ASSIGN_OR_RETURN(Value d, eval(*def));
        frame[name] = std::move(d);
      } else {
        frame[name] = Value();
      }
    }
    for (const auto& [k, v] : a.kw) {
      if (std::none_of(n.params.begin(), n.params.end(), [&](const auto& p) { return p.first == k; })) {
        return error_at(line, "macro '" + n.name + "' has no argument '" + k + "'");
      }
    }
    frames_.push_back(scopes_.size());
    scopes_.push_back(std::move(frame));
    ++macro_depth_;
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string out;
    Status st = render(n.body, out);
    loop_depth_ = saved_loops;
    --macro_depth_;
    scopes_.resize(frames_.back());
    frames_.pop_back();
    GB_RETURN_IF_ERROR(st);
    return Value::string(std::move(out));
  }

  // str.split, refused before its parts outgrow max_built_bytes.
  Result<Value> split_bounded(std::string_view s, const Value* sep, int64_t maxsplit, int line) {
    const auto max_items = static_cast<size_t>(std::max<int64_t>(limits_.max_built_bytes - built_, 0) / kEntryBytes);
    Value parts = py_split(s, sep, maxsplit, max_items);
    if (parts.list->size() > max_items) return build(line, limits_.max_built_bytes);  // the error
    return parts;
  }

  // range(stop) / range(start, stop[, step]) as Python: the count of integers it yields.
  static Result<Range> range_args(const Args& a, int line) {
    int64_t v[3] = {0, 0, 1};
    for (size_t i = 0; i < a.pos.size(); ++i) {
      if (a.pos[i].kind != Value::Kind::kInt) return error_at(line, "range() takes integers");
    }
    if (a.pos.size() == 1) {
      v[1] = a.pos[0].i;
    } else if (a.pos.size() == 2 || a.pos.size() == 3) {
      v[0] = a.pos[0].i, v[1] = a.pos[1].i;
      if (a.pos.size() == 3) v[2] = a.pos[2].i;
    } else {
      return error_at(line, "range() takes 1 to 3 arguments");
    }
    if (v[2] == 0) return error_at(line, "range() step must not be zero");
    const __int128 span = v[2] > 0 ? static_cast<__int128>(v[1]) - v[0] : static_cast<__int128>(v[0]) - v[1];
    const __int128 step = v[2] > 0 ? static_cast<__int128>(v[2]) : -static_cast<__int128>(v[2]);
    const __int128 count = span <= 0 ? 0 : (span + step - 1) / step;
    return Range{.start = v[0], .step = v[2], .count = static_cast<int64_t>(count)};
  }

  Result<Value> global(const std::string& name, const Args& a, int line) {
    if (name == "namespace" || name == "dict") {
      Value ns = name == "namespace" ? Value::new_namespace() : Value::new_dict();
      for (const Value& p : a.pos) {
        if (!p.is_mapping()) return error_at(line, name + "() takes keyword arguments or a mapping");
        for (const auto& [k, v] : p.dict->items) ns.dict->set(k, v);
      }
      for (const auto& [k, v] : a.kw) ns.dict->set(k, v);
      return ns;
    }
    if (name == "raise_exception") {
      const Value* m = a.get(0, "message");
      return invalid_argument("chat template raised an exception: " + (m ? to_output(*m) : std::string()));
    }
    if (name == "range") {  // as a list (a loop over range() walks it without one: loop_range)
      GB_ASSIGN_OR_RETURN(Range r, range_args(a, line));
      GB_RETURN_IF_ERROR(step(line, r.count));
      if (!fits_built(r.count * kEntryBytes))
        return build(line, r.count * kEntryBytes);  // the error, before allocating
      List l;
      l.reserve(static_cast<size_t>(r.count));
      for (int64_t i = 0; i < r.count; ++i) l.push_back(r.at(i));
      return Value::new_list(std::move(l));  // counted by account()
    }
    if (name == "strftime_now") {
      const Value* f = a.get(0, "format");
      if (!f || !f->is_string()) return error_at(line, "strftime_now() takes a format string");
      const std::time_t t = std::time(nullptr);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, f->s.c_str(), &tm);
      return Value::string(std::string(buf, n));
    }
    if (name == "len") {
      if (a.pos.size() != 1) return error_at(line, "len() takes one argument");
      return filter("length", a.pos[0], Args{}, line);
    }
    return error_at(line, "'" + name + "' is undefined (not a macro of this template or a global)");
  }

  Result<Value> method(const Value& obj, const std::string& name, const Args& a, int line) {
    const auto str_arg = [&](size_t i, const char* what) -> Result<std::string> {
      if (i >= a.pos.size() || !a.pos[i].is_string()) return error_at(line, "." + name + "() needs a string " + what);
      return a.pos[i].s;
    };
    if (obj.is_string()) {
      const std::string& s = obj.s;
      if (name == "startswith" || name == "endswith") {
        if (a.pos.empty()) return error_at(line, "." + name + "() needs an argument");
        std::vector<Value> options =
            a.pos[0].kind == Value::Kind::kList ? *a.pos[0].list : std::vector<Value>{a.pos[0]};
        for (const Value& o : options) {
          if (!o.is_string()) return error_at(line, "." + name + "() takes strings");
          const bool hit = name == "startswith"
                               ? s.compare(0, o.s.size(), o.s) == 0 && s.size() >= o.s.size()
                               : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
          if (hit) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split" || name == "rsplit") {
        const Value* sep = a.get(0, "sep");
        const Value* maxsplit = a.get(1, "maxsplit");
        if (sep && !sep->is_none() && (!sep->is_string() || sep->s.empty()))
          return error_at(line, ".split() needs a non-empty string separator");
        if (name == "rsplit" && maxsplit && maxsplit->kind == Value::Kind::kInt && maxsplit->i >= 0) {
          return error_at(line, "unsupported construct '.rsplit()' with maxsplit");
        }
        return split_bounded(s, sep, maxsplit && maxsplit->kind == Value::Kind::kInt ? maxsplit->i : -1, line);
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* chars = a.get(0, "chars");
        if (chars && !chars->is_none() && !chars->is_string()) return error_at(line, "." + name + "() takes a string");
        const std::string* set = chars && chars->is_string() ? &chars->s : nullptr;
        return Value::string(py_strip(s, set, name != "rstrip", name != "lstrip"));
      }
      if (name == "upper" || name == "lower") return Value::string(map_case(s, name == "upper"));
      if (name == "title") return Value::string(title_case(s, false));
      if (name == "capitalize") return Value::string(title_case(map_case(s, false), true));
      if (name == "replace") {
        GB_ASSIGN_OR_RETURN(std::string old, str_arg(0, "to replace"));
        GB_ASSIGN_OR_RETURN(std::string rep, str_arg(1, "replacement"));
        const Value* count = a.get(2, "count");
        std::string r = py_replace(s, old, rep, count && count->kind == Value::Kind::kInt ? count->i : -1,
                                   static_cast<size_t>(limits_.max_output_bytes));
        GB_RETURN_IF_ERROR(string_fits(line, r.size()));
        return Value::string(std::move(r));
      }
      if (name == "find" || name == "count" || name == "index") {
        GB_ASSIGN_OR_RETURN(std::string sub, str_arg(0, "to look for"));
        if (name == "count") {
          int64_t n = 0;
          if (sub.empty()) return Value::integer(static_cast<int64_t>(code_points(s).size()) + 1);
          for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
          return Value::integer(n);
        }
        const size_t p = s.find(sub);
        if (p == std::string::npos) {
          if (name == "index") return error_at(line, "substring not found");
          return Value::integer(-1);
        }
        return Value::integer(static_cast<int64_t>(code_points(s.substr(0, p)).size()));
      }
      if (name == "join") {
        if (a.pos.empty()) return error_at(line, ".join() needs an iterable");
        GB_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(a.pos[0], line));
        std::string out;
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += s;
          out += to_output(items[i]);
          GB_RETURN_IF_ERROR(guard_status(line));
          GB_RETURN_IF_ERROR(string_fits(line, out.size()));
        }
        return Value::string(out);
      }
      if (name == "isdigit" || name == "isalpha" || name == "isspace") {
        if (s.empty()) return Value::boolean(false);
        for (std::string_view c : code_points(s)) {
          const Utf8Step st = utf8_step(c, 0);
          const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(st.code_point));
          const bool ok = name == "isdigit"   ? cat == UTF8PROC_CATEGORY_ND
                          : name == "isalpha" ? (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO)
                                              : py_space(st.code_point);
          if (!ok) return Value::boolean(false);
        }
        return Value::boolean(true);
      }
      if (name == "splitlines") {
        Value l = Value::new_list();
        size_t start = 0;
        for (size_t p = 0; p < s.size(); ++p) {
          if (s[p] == '\n' || s[p] == '\r') {
            GB_RETURN_IF_ERROR(step(line));
            if (!fits_built(static_cast<int64_t>(l.list->size() + 1) * kEntryBytes))
              return build(line, static_cast<int64_t>(l.list->size() + 1) * kEntryBytes);
            l.list->push_back(Value::string(s.substr(start, p - start)));
            if (s[p] == '\r' && p + 1 < s.size() && s[p + 1] == '\n') ++p;
            start = p + 1;
          }
        }
        if (start < s.size()) l.list->push_back(Value::string(s.substr(start)));
        return l;
      }
    }
    if (obj.is_mapping()) {
      if (name == "cycle" && obj.dict->find("index0")) {  // loop.cycle(a, b, ...)
        if (a.pos.empty()) return error_at(line, "loop.cycle() needs arguments");
        return a.pos[static_cast<size_t>(obj.dict->find("index0")->i) % a.pos.size()];
      }
      if (name == "items" || name == "keys" || name == "values") {
        Value l = Value::new_list();
        for (const auto& [k, v] : obj.dict->items) {
          if (name == "items") {
            l.list->push_back(Value::new_list({Value::string(k), v}));
          } else {
            l.list->push_back(name == "keys" ? Value::string(k) : v);
          }
        }
        return l;
      }
      if (name == "get") {
        GB_ASSIGN_OR_RETURN(std::string key, str_arg(0, "key"));
        const Value* v = obj.dict->find(key);
        if (v) return *v;
        const Value* def = a.get(1, "default");
        return def ? *def : Value::none();
      }
    }
    if (obj.kind == Value::Kind::kList) {
      if (name == "append") {
        if (a.pos.size() != 1) return error_at(line, ".append() takes one argument");
        GB_RETURN_IF_ERROR(
            build(line, kEntryBytes + (a.pos[0].is_string() ? static_cast<int64_t>(a.pos[0].s.size()) : 0)));
        obj.list->push_back(a.pos[0]);
        return Value::none();
      }
      if (name == "pop") {
        if (obj.list->empty()) return error_at(line, "pop from an empty list");
        int64_t i = a.pos.empty() ? -1 : a.pos[0].i;
        const int64_t n = static_cast<int64_t>(obj.list->size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return error_at(line, "pop index out of range");
        Value v = (*obj.list)[i];
        obj.list->erase(obj.list->begin() + i);
        return v;
      }
      if (name == "index" || name == "count") {
        if (a.pos.size() != 1) return error_at(line, "." + name + "() takes one argument");
        GB_RETURN_IF_ERROR(step(line, static_cast<int64_t>(obj.list->size())));
        int64_t n = 0;
        for (size_t i = 0; i < obj.list->size(); ++i) {
          if (equal((*obj.list)[i], a.pos[0])) {
            if (name == "index") return Value::integer(static_cast<int64_t>(i));
            ++n;
          }
        }
        if (name == "index") return error_at(line, "value not in list");
        return Value::integer(n);
      }
    }
    if (obj.is_undefined()) return error_at(line, "cannot call '." + name + "()' on an undefined value");
    return error_at(line, std::string("'") + type_name(obj) + "' object has no method '" + name + "'");
  }

  Result<bool> test(const std::string& name, const Value& v, const Args& a, int line) {
    using K = Value::Kind;
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.kind == K::kBool;
    if (name == "true") return v.kind == K::kBool && v.b;
    if (name == "false") return v.kind == K::kBool && !v.b;
    if (name == "string") return v.is_string();
    if (name == "number") return v.kind == K::kInt || v.kind == K::kFloat;
    if (name == "integer") return v.kind == K::kInt;
    if (name == "float") return v.kind == K::kFloat;
    if (name == "mapping") return v.kind == K::kDict;
    if (name == "iterable") return v.kind == K::kList || v.kind == K::kDict || v.is_string();
    if (name == "sequence") return v.kind == K::kList || v.kind == K::kDict || v.is_string();
    if (name == "callable") return v.kind == K::kMacro;
    if (name == "lower") return v.is_string() && map_case(v.s, false) == v.s;
    if (name == "upper") return v.is_string() && map_case(v.s, true) == v.s;
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.kind != K::kInt) return error_at(line, "the test '" + name + "' needs an integer");
      if (name == "odd") return v.i % 2 != 0;
      if (name == "even") return v.i % 2 == 0;
      const Value* d = a.get(0, "num");
      if (!d || d->kind != K::kInt || d->i == 0) return error_at(line, "'divisibleby' needs a non-zero integer");
      return v.i % d->i == 0;
    }
    const Value* other = a.get(0, "other");
    if (!other) return error_at(line, "the test '" + name + "' needs an argument");
    if (name == "eq" || name == "equalto") return equal(v, *other);
    if (name == "ne") return !equal(v, *other);
    if (name == "sameas") return equal(v, *other) && v.kind == other->kind;
    if (name == "in") {
      GB_ASSIGN_OR_RETURN(Value r, contains(*other, v, line));
      return r.b;
    }
    GB_ASSIGN_OR_RETURN(int c, compare(v, *other, line));
    if (name == "lt") return c < 0;
    if (name == "le") return c <= 0;
    if (name == "gt") return c > 0;
    return c >= 0;  // ge
  }

  Result<int> compare(const Value& a, const Value& b, int line) {
    if (a.is_number() && b.is_number()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
    return error_at(line, std::string("cannot compare '") + type_name(a) + "' with '" + type_name(b) + "'");
  }

  Result<Value> contains(const Value& container, const Value& item, int line) {
    if (container.is_string()) {
      if (!item.is_string()) return error_at(line, "'in <string>' needs a string on the left");
      return Value::boolean(container.s.find(item.s) != std::string::npos);
    }
    if (container.kind == Value::Kind::kList) {
      GB_RETURN_IF_ERROR(step(line, static_cast<int64_t>(container.list->size())));
      for (const Value& x : *container.list) {
        if (equal(x, item)) return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (container.is_mapping()) return Value::boolean(item.is_string() && container.dict->find(item.s) != nullptr);
    if (container.is_undefined()) return Value::boolean(false);
    return error_at(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
  }

  Result<Value> binary(const Expr& e) {
    const std::string& op = e.name;
    GB_ASSIGN_OR_RETURN(Value a, eval(*e.args[0]));
    if (op == "and") return truthy(a) ? eval(*e.args[1]) : Result<Value>(a);
    if (op == "or") return truthy(a) ? Result<Value>(a) : eval(*e.args[1]);
    GB_ASSIGN_OR_RETURN(Value b, eval(*e.args[1]));
    using K = Value::Kind;
    if (op == "==") return Value::boolean(equal(a, b));
    if (op == "!=") return Value::boolean(!equal(a, b));
    if (op == "in" || op == "not in") {
      GB_ASSIGN_OR_RETURN(Value r, contains(b, a, e.line));
      return Value::boolean(op == "in" ? r.b : !r.b);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      GB_ASSIGN_OR_RETURN(int c, compare(a, b, e.line));
      return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "~") {
      std::string x = a.is_string() ? a.s : to_output(a);
      const std::string y = b.is_string() ? b.s : to_output(b);
      GB_RETURN_IF_ERROR(guard_status(e.line));
      GB_RETURN_IF_ERROR(string_fits(e.line, x.size() + y.size()));
      x += y;
      return Value::string(std::move(x));
    }
    const auto type_error = [&]() {
      return error_at(e.line,
                      "unsupported operand types for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        GB_RETURN_IF_ERROR(string_fits(e.line, a.s.size() + b.s.size()));
        return Value::string(a.s + b.s);
      }
      if (a.kind == K::kList && b.kind == K::kList) {
        const auto entries = static_cast<int64_t>(a.list->size() + b.list->size());
        GB_RETURN_IF_ERROR(step(e.line, entries));
        if (!fits_built(entries * kEntryBytes)) return build(e.line, entries * kEntryBytes);
        List l = *a.list;
        l.insert(l.end(), b.list->begin(), b.list->end());
        return Value::new_list(std::move(l));
      }
    }
    if (op == "*" && ((a.is_string() && b.kind == K::kInt) || (a.kind == K::kInt && b.is_string()))) {
      const std::string& s = a.is_string() ? a.s : b.s;
      const int64_t n = a.is_string() ? b.i : a.i;
      if (n > 0 &&
          static_cast<double>(n) * static_cast<double>(s.size()) > static_cast<double>(limits_.max_output_bytes))
        return string_fits(e.line, SIZE_MAX);
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += s;
      return Value::string(out);
    }
    if (!a.is_number() || !b.is_number()) return type_error();
    const bool ints = a.kind != K::kFloat && b.kind != K::kFloat;
    const int64_t x = a.kind == K::kBool ? a.b : a.i, y = b.kind == K::kBool ? b.b : b.i;
    const double fx = a.as_double(), fy = b.as_double();
    if (op == "+") return ints ? Value::integer(x + y) : Value::number(fx + fy);
    if (op == "-") return ints ? Value::integer(x - y) : Value::number(fx - fy);
    if (op == "*") return ints ? Value::integer(x * y) : Value::number(fx * fy);
    if (op == "/") {
      if (fy == 0) return error_at(e.line, "division by zero");
      return Value::number(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) return error_at(e.line, "integer division or modulo by zero");
      if (ints) {
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;  // Python floors
        return Value::integer(op == "//" ? q : r);
      }
      const double q = std::floor(fx / fy);
      return Value::number(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < y && i < 64; ++i) r *= x;
        return Value::integer(r);
      }
      return Value::number(std::pow(fx, fy));
    }
    return type_error();
  }

  Result<Value> filter(const std::string& name, const Value& v, const Args& a, int line) {
    using K = Value::Kind;
    if (name == "tojson") {
      const Value* indent = a.get(0, "indent");
      const Value* sort = a.get(99, "sort_keys");
      const Value* ascii = a.get(99, "ensure_ascii");
      if (ascii && truthy(*ascii)) return error_at(line, "unsupported construct 'tojson(ensure_ascii=true)'");
      if (a.get(99, "separators")) return error_at(line, "unsupported construct 'tojson(separators=...)'");
      if (indent && !indent->is_none() && indent->kind != K::kInt)
        return error_at(line, "tojson(indent=...) takes an integer");
      auto text =
          to_json_text(v, indent && indent->kind == K::kInt ? static_cast<int>(indent->i) : -1, sort && truthy(*sort));
      if (!text.ok()) {
        GB_RETURN_IF_ERROR(guard_status(line));
        return error_at(line, text.status().message());
      }
      return Value::string(*text);
    }
    if (name == "trim") {
      const Value* chars = a.get(0, "chars");
      return Value::string(py_strip(to_output(v), chars && chars->is_string() ? &chars->s : nullptr, true, true));
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case K::kUndefined:
          return Value::integer(0);
        case K::kString:
          return Value::integer(static_cast<int64_t>(code_points(v.s).size()));
        case K::kList:
          return Value::integer(static_cast<int64_t>(v.list->size()));
        case K::kDict:
        case K::kNamespace:
          return Value::integer(static_cast<int64_t>(v.dict->items.size()));
        default:
          return error_at(line, std::string("object of type '") + type_name(v) + "' has no length");
      }
    }
    if (name == "upper" || name == "lower") return Value::string(map_case(to_output(v), name == "upper"));
    if (name == "title") return Value::string(title_case(to_output(v), false));
    if (name == "capitalize") return Value::string(title_case(map_case(to_output(v), false), true));
    if (name == "string") return Value::string(to_output(v));
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : to_output(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::string(out);
    }
    if (name == "default" || name == "d") {
      const Value* def = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      const bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (def ? *def : Value::string("")) : v;
    }
    if (name == "items" || name == "dictsort") {
      if (v.is_undefined()) return Value::new_list();
      if (!v.is_mapping()) return error_at(line, "the filter '" + name + "' needs a mapping");
      GB_ASSIGN_OR_RETURN(Value items, method(v, "items", Args{}, line));
      if (name == "dictsort") {
        std::stable_sort(items.list->begin(), items.list->end(), [](const Value& x, const Value& y) {
          return map_case((*x.list)[0].s, false) < map_case((*y.list)[0].s, false);
        });
      }
      return items;
    }
    if (name == "int" || name == "float") {
      const Value* def = a.get(0, "default");
      double d = 0;
      bool ok = true;
      if (v.is_number()) {
        d = v.as_double();
      } else if (v.is_string()) {
        try {
          size_t used = 0;
          const std::string t = py_strip(v.s, nullptr, true, true);
          d = std::stod(t, &used);
          ok = used == t.size() && (name == "float" || t.find_first_of(".eE") == std::string::npos);
        } catch (const std::exception&) {
          ok = false;
        }
      } else {
        ok = false;
      }
      if (!ok) return def ? *def : (name == "int" ? Value::integer(0) : Value::number(0));
      if (name == "int") return v.kind == K::kInt ? v : Value::integer(static_cast<int64_t>(std::trunc(d)));
      return Value::number(d);
    }
    if (name == "abs") {
      if (!v.is_number()) return error_at(line, "abs needs a number");
      return v.kind == K::kFloat ? Value::number(std::fabs(v.f))
                                 : Value::integer(std::llabs(v.kind == K::kBool ? v.b : v.i));
    }
    if (name == "round") {
      if (!v.is_number()) return error_at(line, "round needs a number");
      const Value* prec = a.get(0, "precision");
      const double p = std::pow(10.0, prec && prec->kind == K::kInt ? static_cast<double>(prec->i) : 0.0);
      return Value::number(std::round(v.as_double() * p) / p);
    }
    if (name == "replace") {
      if (a.pos.size() < 2 || !a.pos[0].is_string() || !a.pos[1].is_string())
        return error_at(line, "replace needs two strings");
      const Value* count = a.get(2, "count");
      std::string r = py_replace(to_output(v), a.pos[0].s, a.pos[1].s, count && count->kind == K::kInt ? count->i : -1,
                                 static_cast<size_t>(limits_.max_output_bytes));
      GB_RETURN_IF_ERROR(string_fits(line, r.size()));
      return Value::string(std::move(r));
    }
    if (name == "indent") {
      const Value* width = a.get(0, "width");
      const Value* first = a.get(1, "first");
      const Value* blank = a.get(2, "blank");
      const std::string pad =
          width && width->is_string()
              ? width->s
              : std::string(width && width->kind == K::kInt ? static_cast<size_t>(width->i) : 4, ' ');
      if (width && width->kind == K::kInt && (width->i < 0 || width->i > limits_.max_output_bytes))
        return string_fits(line, SIZE_MAX);
      const std::string s = to_output(v);
      std::string out;
      size_t start = 0;
      bool first_line = true;
      for (;;) {
        const size_t nl = s.find('\n', start);
        const std::string ln = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        const bool add = (first_line ? (first && truthy(*first)) : true) && (!ln.empty() || (blank && truthy(*blank)));
        out += (add ? pad : "") + ln;
        GB_RETURN_IF_ERROR(string_fits(line, out.size()));
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
        first_line = false;
      }
      return Value::string(out);
    }
    if (name == "wordcount") {
      GB_ASSIGN_OR_RETURN(Value words, split_bounded(to_output(v), nullptr, -1, line));
      return Value::integer(static_cast<int64_t>(words.list->size()));
    }
    // Filters over sequences.
    GB_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v, line));
    if (name == "list") return Value::new_list(std::move(items));
    if (name == "first" || name == "last") {
      if (items.empty()) return Value();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      std::reverse(items.begin(), items.end());
      if (v.is_string()) {
        std::string s;
        for (const Value& c : items) s += c.s;
        return Value::string(s);
      }
      return Value::new_list(std::move(items));
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        Value x = items[i];
        if (attr && attr->is_string()) {
          GB_ASSIGN_OR_RETURN(x, index(x, *attr, line));
        }
        out += (i && sep ? to_output(*sep) : "") + to_output(x);
        GB_RETURN_IF_ERROR(guard_status(line));
        GB_RETURN_IF_ERROR(string_fits(line, out.size()));
      }
      return Value::string(out);
    }
    if (name == "sum") {
      Value acc = Value::integer(0);
      for (const Value& x : items) {
        if (!x.is_number()) return error_at(line, "sum needs numbers");
        acc = acc.kind == K::kInt && x.kind != K::kFloat ? Value::integer(acc.i + (x.kind == K::kBool ? x.b : x.i))
                                                         : Value::number(acc.as_double() + x.as_double());
      }
      return acc;
    }
    if (name == "min" || name == "max" || name == "sort" || name == "unique") {
      const Value* attr = a.get(name == "sort" ? 2 : 1, "attribute");
      const Value* reverse = name == "sort" ? a.get(0, "reverse") : nullptr;
      const Value* case_sensitive = a.get(name == "sort" ? 1 : 0, "case_sensitive");
      Status bad = ok_status();
      const auto key = [&](const Value& x) -> Value {
        Value k = x;
        if (attr && attr->is_string()) {
          auto r = index(x, *attr, line);
          k = r.ok() ? *r : Value();
        }
        if (k.is_string() && !(case_sensitive && truthy(*case_sensitive))) k.s = map_case(k.s, false);
        return k;
      };
      const auto less = [&](const Value& x, const Value& y) {
        auto c = compare(key(x), key(y), line);
        if (!c.ok()) {
          if (bad.ok()) bad = c.status();
          return false;
        }
        return *c < 0;
      };
      if (name == "unique") {
        std::vector<Value> out;
        for (const Value& x : items) {
          GB_RETURN_IF_ERROR(step(line, static_cast<int64_t>(out.size())));
          if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(key(x), key(y)); }))
            out.push_back(x);
        }
        return Value::new_list(std::move(out));
      }
      if (items.empty()) return Value();
      if (name == "sort") {
        std::stable_sort(items.begin(), items.end(), less);
        if (reverse && truthy(*reverse)) std::reverse(items.begin(), items.end());
        GB_RETURN_IF_ERROR(bad);
        return Value::new_list(std::move(items));
      }
      const auto it = name == "min" ? std::min_element(items.begin(), items.end(), less)
                                    : std::max_element(items.begin(), items.end(), less);
      GB_RETURN_IF_ERROR(bad);
      return *it;
    }
    if (name == "map") {
      const Value* attr = a.get(99, "attribute");
      std::vector<Value> out;
      for (const Value& x : items) {
        if (attr) {
          GB_ASSIGN_OR_RETURN(Value y, index(x, *attr, line));
          if (y.is_undefined()) {
            if (const Value* def = a.get(99, "default")) y = *def;
          }
          out.push_back(std::move(y));
        } else {
          if (a.pos.empty() || !a.pos[0].is_string()) return error_at(line, "map needs attribute= or a filter name");
          Args rest;
          rest.pos.assign(a.pos.begin() + 1, a.pos.end());
          GB_ASSIGN_OR_RETURN(Value y, filter(a.pos[0].s, x, rest, line));
          out.push_back(std::move(y));
        }
      }
      return Value::new_list(std::move(out));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool by_attr = name == "selectattr" || name == "rejectattr";
      const bool keep_when = name == "select" || name == "selectattr";
      size_t k = 0;
      const Value* attr = nullptr;
      if (by_attr) {
        if (a.pos.empty() || !a.pos[0].is_string()) return error_at(line, name + " needs an attribute name");
        attr = &a.pos[0];
        k = 1;
      }
      std::vector<Value> out;
      for (const Value& x : items) {
        Value subject = x;
        if (attr) {
          GB_ASSIGN_OR_RETURN(subject, index(x, *attr, line));
        }
        bool r;
        if (k < a.pos.size()) {
          if (!a.pos[k].is_string()) return error_at(line, name + " needs a test name");
          Args rest;
          rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k) + 1, a.pos.end());
          GB_ASSIGN_OR_RETURN(r, test(a.pos[k].s, subject, rest, line));
        } else {
          r = truthy(subject);
        }
        if (r == keep_when) out.push_back(x);
      }
      return Value::new_list(std::move(out));
    }
    return error_at(line, "internal: filter '" + name + "' has no implementation");
  }

  const RenderLimits& limits_;
  ValueGuard guard_;
  ValueGuard::Scope guard_scope_;  // installs guard_ for this thread while the render runs
  int64_t steps_ = 0, next_poll_ = RenderLimits::kPollSteps;
  int64_t built_ = 0;
  int depth_ = 0;
  std::vector<Scope> scopes_;
  std::vector<size_t> frames_;  // the first scope of each macro call (0: the template)
  Control control_ = Control::kNone;
  int loop_depth_ = 0;
  int macro_depth_ = 0;
};

}  // namespace

Result<std::string> Template::render(const Value& context, const RenderLimits& limits) const {
  Renderer r(context, limits);
  std::string out;
  GB_RETURN_IF_ERROR(r.render(*body_, out));
  return out;
}

}  // namespace genbridge::text::jinja
