// Parsing: the template is cut into text and tags (with Jinja2's whitespace control, trim_blocks and
// lstrip_blocks), tags are tokenized, and a recursive-descent parser builds the tree. Written by hand:
// no C++ Jinja2 implementation is packaged by Debian (inja implements a different language).
#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <map>
#include <set>

#include "text/jinja/template.h"

namespace genbridge::text::jinja {
namespace {

Status syntax_error(int line, const std::string& what) {
  return invalid_argument("chat template line " + std::to_string(line) + ": " + what);
}

// One level of nesting for as long as it lives (the parser's recursion is bounded by kMaxTemplateNesting).
class Nest {
 public:
  explicit Nest(int& depth) : depth_(depth) { ++depth_; }
  ~Nest() { --depth_; }
  Nest(const Nest&) = delete;
  Nest& operator=(const Nest&) = delete;
  bool too_deep() const { return depth_ > kMaxTemplateNesting; }

 private:
  int& depth_;
};
Status expression_too_deep(int line) {
  return syntax_error(line, "an expression nests deeper than " + std::to_string(kMaxTemplateNesting) +
                                " levels (brackets, operators and calls within each other)");
}

// ---- template level: text and tags ----

struct Segment {
  enum class Kind { kText, kVar, kBlock };
  Kind kind;
  std::string content;  // text, or the tag's inside without delimiters and whitespace-control marks
  int line;
};

Result<std::vector<Segment>> split_template(std::string_view src) {
  std::vector<Segment> segs;
  size_t pos = 0;
  int line = 1;
  bool strip_next_text = false;  // the previous tag ended with '-'
  const auto count_lines = [](std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); };
  while (pos <= src.size()) {
    size_t open = std::string_view::npos;
    for (size_t p = src.find('{', pos); p != std::string_view::npos && p + 1 < src.size(); p = src.find('{', p + 1)) {
      if (src[p + 1] == '{' || src[p + 1] == '%' || src[p + 1] == '#') {
        open = p;
        break;
      }
    }
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    const bool line_starting = pos == 0 || src[pos - 1] == '\n';
    if (strip_next_text)
      text.erase(0, text.find_first_not_of(" \t\r\n\f\v") == std::string::npos ? text.size()
                                                                               : text.find_first_not_of(" \t\r\n\f\v"));
    if (open == std::string_view::npos) {
      // Jinja2 (keep_trailing_newline=False) drops one newline at the end of the template.
      if (!text.empty() && text.back() == '\n') text.pop_back();
      if (!text.empty()) segs.push_back({Segment::Kind::kText, text, line});
      break;
    }
    const char type = src[open + 1];
    const int tag_line = line + count_lines(src.substr(pos, open - pos));
    size_t inner = open + 2;
    const bool left_minus = inner < src.size() && src[inner] == '-';
    const bool left_plus = inner < src.size() && src[inner] == '+';
    if (left_minus || left_plus) ++inner;
    if (left_minus) {
      const size_t keep = text.find_last_not_of(" \t\r\n\f\v");
      text.erase(keep == std::string::npos ? 0 : keep + 1);
    } else if (type != '{' && !left_plus) {
      // lstrip_blocks: spaces and tabs between the start of a line and a block or comment tag go.
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      if ((nl != std::string::npos || line_starting) && text.find_first_not_of(" \t", from) == std::string::npos) {
        text.erase(from);
      }
    }
    if (!text.empty()) segs.push_back({Segment::Kind::kText, text, line});
    // Find the closing delimiter, skipping string literals inside expressions and statements.
    const char close_char = type == '{' ? '}' : type == '%' ? '%' : '#';
    size_t p = inner;
    char quote = 0;
    size_t close = std::string_view::npos;
    for (; p + 1 < src.size(); ++p) {
      const char c = src[p];
      if (type != '#') {
        if (quote) {
          if (c == '\\') {
            ++p;
          } else if (c == quote) {
            quote = 0;
          }
          continue;
        }
        if (c == '\'' || c == '"') {
          quote = c;
          continue;
        }
      }
      if (c == close_char && src[p + 1] == '}') {
        close = p;
        break;
      }
    }
    if (close == std::string_view::npos) {
      const char* what = type == '{' ? "'}}'" : type == '%' ? "'%}'" : "'#}'";
      return syntax_error(tag_line, std::string("a tag is not closed: ") + what + " is missing");
    }
    size_t inner_end = close;
    const bool right_minus = inner_end > inner && src[inner_end - 1] == '-';
    const bool right_plus = inner_end > inner && src[inner_end - 1] == '+';
    if (right_minus || right_plus) --inner_end;
    if (type != '#') {
      segs.push_back({type == '{' ? Segment::Kind::kVar : Segment::Kind::kBlock,
                      std::string(src.substr(inner, inner_end - inner)), tag_line});
    }
    line = tag_line + count_lines(src.substr(open, close + 2 - open));
    pos = close + 2;
    strip_next_text = right_minus;
    // trim_blocks: the first newline after a block or comment tag goes.
    if (type != '{' && !right_minus && !right_plus && pos < src.size() && src[pos] == '\n') {
      ++pos;
      ++line;
    }
  }
  return segs;
}

// ---- expression tokens ----

struct Token {
  enum class Kind { kName, kInt, kFloat, kString, kOp, kEnd };
  Kind kind;
  std::string text;
  int line;
  int64_t i = 0;
  double f = 0;
};

Result<std::vector<Token>> tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  size_t p = 0;
  static const char* kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                               ">",  "=",  "|",  ".",  ",",  ":",  "(", ")", "[", "]", "{", "}"};
  while (p < s.size()) {
    const char c = s[p];
    if (c == '\n') ++line;
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++p;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t q = p;
      while (q < s.size() && (std::isalnum(static_cast<unsigned char>(s[q])) || s[q] == '_')) ++q;
      out.push_back({Token::Kind::kName, s.substr(p, q - p), line});
      p = q;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t q = p;
      bool is_float = false;
      while (q < s.size() && (std::isdigit(static_cast<unsigned char>(s[q])) || s[q] == '_')) ++q;
      if (q + 1 < s.size() && s[q] == '.' && std::isdigit(static_cast<unsigned char>(s[q + 1]))) {
        is_float = true;
        ++q;
        while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
      }
      if (q < s.size() && (s[q] == 'e' || s[q] == 'E')) {
        size_t r = q + 1;
        if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
        if (r < s.size() && std::isdigit(static_cast<unsigned char>(s[r]))) {
          is_float = true;
          q = r;
          while (q < s.size() && std::isdigit(static_cast<unsigned char>(s[q]))) ++q;
        }
      }
      std::string num = s.substr(p, q - p);
      num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
      Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, num, line};
      try {
        if (is_float) {
          t.f = std::stod(num);
        } else {
          t.i = std::stoll(num);
        }
      } catch (const std::exception&) {
        return syntax_error(line, "the number " + num + " is out of range");
      }
      out.push_back(t);
      p = q;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      size_t q = p + 1;
      for (; q < s.size() && s[q] != c; ++q) {
        if (s[q] == '\n') ++line;
        if (s[q] != '\\' || q + 1 >= s.size()) {
          v += s[q];
          continue;
        }
        const char e = s[++q];
        switch (e) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '\\':
          case '\'':
          case '"':
            v += e;
            break;
          default:  // Python keeps unknown escapes as written
            v += '\\';
            v += e;
        }
      }
      if (q >= s.size()) return syntax_error(line, "a string literal is not closed");
      out.push_back({Token::Kind::kString, v, line});
      p = q + 1;
      continue;
    }
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (s.compare(p, n, op) == 0) {
        out.push_back({Token::Kind::kOp, op, line});
        p += n;
        matched = true;
        break;
      }
    }
    if (!matched) return syntax_error(line, std::string("unexpected character '") + c + "'");
  }
  out.push_back({Token::Kind::kEnd, "", line});
  return out;
}

// ---- the subset ----

const std::set<std::string, std::less<>> kFilters = {
    "abs",    "capitalize", "count",      "d",       "default", "dictsort", "e",     "escape",   "first",      "float",
    "indent", "int",        "items",      "join",    "last",    "length",   "list",  "lower",    "map",        "max",
    "min",    "reject",     "rejectattr", "replace", "reverse", "round",    "safe",  "select",   "selectattr", "sort",
    "string", "sum",        "title",      "tojson",  "trim",    "unique",   "upper", "wordcount"};
const std::set<std::string, std::less<>> kTests = {
    "boolean", "callable", "defined", "divisibleby", "eq",     "equalto", "even",      "false",   "float", "ge",
    "gt",      "in",       "integer", "iterable",    "le",     "lower",   "lt",        "mapping", "ne",    "none",
    "number",  "odd",      "sameas",  "sequence",    "string", "true",    "undefined", "upper"};
const std::set<std::string, std::less<>> kMethods = {
    "append", "capitalize", "count",   "endswith", "find",    "get",        "items",      "join",  "keys",
    "lower",  "lstrip",     "replace", "rstrip",   "split",   "startswith", "strip",      "title", "upper",
    "values", "cycle",      "isdigit", "isalpha",  "isspace", "rsplit",     "splitlines", "pop",   "index"};
const std::set<std::string, std::less<>> kGlobals = {"namespace", "raise_exception", "range", "strftime_now", "dict",
                                                     "len"};

class ExprParser {
 public:
  ExprParser(std::vector<Token> toks, std::map<std::string, int>* called) : t_(std::move(toks)), called_(called) {}

  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  bool is_op(std::string_view op, size_t k = 0) const { return peek(k).kind == Token::Kind::kOp && peek(k).text == op; }
  bool is_name(std::string_view n, size_t k = 0) const {
    return peek(k).kind == Token::Kind::kName && peek(k).text == n;
  }
  Token next() { return t_[std::min(i_++, t_.size() - 1)]; }
  Status expect_op(std::string_view op) {
    if (!is_op(op))
      return syntax_error(peek().line, "expected '" + std::string(op) + "' but found " + describe(peek()));
    ++i_;
    return ok_status();
  }
  Result<std::string> expect_name() {
    if (peek().kind != Token::Kind::kName)
      return syntax_error(peek().line, "expected a name but found " + describe(peek()));
    return next().text;
  }
  Status expect_end(const std::string& what) {
    if (!at_end()) return syntax_error(peek().line, "unexpected " + describe(peek()) + " after " + what);
    return ok_status();
  }
  static std::string describe(const Token& t) {
    return t.kind == Token::Kind::kEnd ? "the end of the tag" : "'" + t.text + "'";
  }

  Result<ExprPtr> expression() {  // a if b else c
    const Nest nest(depth_);
    if (nest.too_deep()) return expression_too_deep(peek().line);
    GB_ASSIGN_OR_RETURN(ExprPtr e, or_expr());
    if (is_name("if")) {
      const int line = next().line;
      GB_ASSIGN_OR_RETURN(ExprPtr cond, or_expr());
      ExprPtr other;
      if (is_name("else")) {
        next();
        GB_ASSIGN_OR_RETURN(other, expression());
      }
      auto c = make(Expr::Kind::kCond, line);
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(other));
      return c;
    }
    return e;
  }

  // A loop's iterable: no conditional expression (its `if` filters the loop).
  Result<ExprPtr> iterable() { return or_expr(); }

  // A comma-separated list without brackets becomes a tuple (e.g. `{% set a, b = 1, 2 %}`).
  Result<ExprPtr> tuple_or_expression() {
    GB_ASSIGN_OR_RETURN(ExprPtr e, expression());
    if (!is_op(",")) return e;
    auto t = make(Expr::Kind::kTuple, e->line);
    t->args.push_back(std::move(e));
    while (is_op(",")) {
      next();
      if (at_end()) break;
      GB_ASSIGN_OR_RETURN(ExprPtr x, expression());
      t->args.push_back(std::move(x));
    }
    return t;
  }

 private:
  // Sets `e`'s height from its parts'; a chain of operators, filters or subscripts taller than
  // kMaxTemplateNesting is refused (its evaluation and its destruction recurse once per level).
  static Status taller(Expr& e) {
    for (const ExprPtr& a : e.args) {
      if (a) e.height = std::max(e.height, a->height + 1);
    }
    for (const auto& kv : e.kwargs) e.height = std::max(e.height, kv.second->height + 1);
    if (e.height > kMaxTemplateNesting) return expression_too_deep(e.line);
    return ok_status();
  }
  static ExprPtr make(Expr::Kind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }
  static ExprPtr binary(std::string op, ExprPtr a, ExprPtr b, int line) {
    auto e = make(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  Result<ExprPtr> or_expr() { return left_assoc(Token::Kind::kName, {"or"}, &ExprParser::and_expr); }
  Result<ExprPtr> and_expr() { return left_assoc(Token::Kind::kName, {"and"}, &ExprParser::not_expr); }
  Result<ExprPtr> not_expr() {
    if (is_name("not")) {
      const int line = next().line;
      const Nest nest(depth_);
      if (nest.too_deep()) return expression_too_deep(line);
      GB_ASSIGN_OR_RETURN(ExprPtr x, not_expr());
      auto e = make(Expr::Kind::kUnary, line);
      e->name = "not";
      e->args.push_back(std::move(x));
      GB_RETURN_IF_ERROR(taller(*e));
      return e;
    }
    return compare();
  }
  Result<ExprPtr> compare() {
    GB_ASSIGN_OR_RETURN(ExprPtr e, math1());
    for (;;) {
      std::string op;
      if (peek().kind == Token::Kind::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                              peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = peek().text;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && is_name("in", 1)) {
        op = "not in";
        next();
        next();
      } else {
        return e;
      }
      GB_ASSIGN_OR_RETURN(ExprPtr r, math1());
      const int line = r->line;
      e = binary(op, std::move(e), std::move(r), line);
      GB_RETURN_IF_ERROR(taller(*e));
    }
  }
  // One left-associative level of binary operators: operands parsed by `operand`, joined by any of `ops`
  // (operator tokens, or names for the keyword operators).
  Result<ExprPtr> left_assoc(Token::Kind kind, std::initializer_list<std::string_view> ops,
                             Result<ExprPtr> (ExprParser::*operand)()) {
    const auto at_op = [&] {
      return peek().kind == kind && std::find(ops.begin(), ops.end(), std::string_view(peek().text)) != ops.end();
    };
    GB_ASSIGN_OR_RETURN(ExprPtr e, (this->*operand)());
    while (at_op()) {
      const Token op = next();
      GB_ASSIGN_OR_RETURN(ExprPtr r, (this->*operand)());
      e = binary(op.text, std::move(e), std::move(r), op.line);
      GB_RETURN_IF_ERROR(taller(*e));
    }
    return e;
  }
  Result<ExprPtr> math1() { return left_assoc(Token::Kind::kOp, {"+", "-"}, &ExprParser::concat); }
  Result<ExprPtr> concat() { return left_assoc(Token::Kind::kOp, {"~"}, &ExprParser::math2); }
  Result<ExprPtr> math2() { return left_assoc(Token::Kind::kOp, {"*", "/", "//", "%"}, &ExprParser::power); }
  Result<ExprPtr> power() { return left_assoc(Token::Kind::kOp, {"**"}, &ExprParser::unary); }
  Result<ExprPtr> unary() {
    if (is_op("-") || is_op("+")) {
      const Token op = next();
      const Nest nest(depth_);
      if (nest.too_deep()) return expression_too_deep(op.line);
      GB_ASSIGN_OR_RETURN(ExprPtr x, unary());
      auto e = make(Expr::Kind::kUnary, op.line);
      e->name = op.text;
      e->args.push_back(std::move(x));
      GB_RETURN_IF_ERROR(taller(*e));
      return e;
    }
    GB_ASSIGN_OR_RETURN(ExprPtr e, primary());
    GB_ASSIGN_OR_RETURN(e, postfix(std::move(e)));
    return filters_and_tests(std::move(e));
  }

  Status call_args(Expr& call) {
    GB_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        GB_ASSIGN_OR_RETURN(ExprPtr v, expression());
        call.kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!call.kwargs.empty()) return syntax_error(peek().line, "a positional argument follows a keyword argument");
        GB_ASSIGN_OR_RETURN(ExprPtr v, expression());
        call.args.push_back(std::move(v));
      }
      if (!is_op(",")) break;
      next();
    }
    return expect_op(")");
  }

  Result<ExprPtr> postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        const int line = next().line;
        GB_ASSIGN_OR_RETURN(std::string name, expect_name());
        if (is_op("(")) {
          if (!kMethods.count(name)) return syntax_error(line, "unsupported method '." + name + "()'");
        }
        auto a = make(Expr::Kind::kAttr, line);
        a->name = name;
        a->args.push_back(std::move(e));
        e = std::move(a);
        GB_RETURN_IF_ERROR(taller(*e));
      } else if (is_op("[")) {
        const int line = next().line;
        ExprPtr parts[3];
        int colons = 0;
        for (;;) {
          if (is_op("]")) break;
          if (is_op(":")) {
            if (++colons > 2) return syntax_error(line, "a slice has at most two ':'");
            next();
            continue;
          }
          if (parts[colons]) return syntax_error(peek().line, "expected ']' or ':' in a subscript");
          GB_ASSIGN_OR_RETURN(parts[colons], expression());
        }
        next();
        if (colons == 0) {
          if (!parts[0]) return syntax_error(line, "an empty subscript '[]'");
          auto x = make(Expr::Kind::kIndex, line);
          x->args.push_back(std::move(e));
          x->args.push_back(std::move(parts[0]));
          e = std::move(x);
          GB_RETURN_IF_ERROR(taller(*e));
        } else {
          auto x = make(Expr::Kind::kSlice, line);
          x->args.push_back(std::move(e));
          for (auto& p : parts) x->args.push_back(std::move(p));
          e = std::move(x);
          GB_RETURN_IF_ERROR(taller(*e));
        }
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::kCall, peek().line);
        if (e->kind == Expr::Kind::kName) called_->emplace(e->name, c->line);
        c->args.push_back(std::move(e));
        GB_RETURN_IF_ERROR(call_args(*c));
        e = std::move(c);
        GB_RETURN_IF_ERROR(taller(*e));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> filters_and_tests(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        const int line = next().line;
        GB_ASSIGN_OR_RETURN(std::string name, expect_name());
        if (!kFilters.count(name)) return syntax_error(line, "unsupported filter '" + name + "'");
        auto f = make(Expr::Kind::kFilter, line);
        f->name = name;
        f->args.push_back(std::move(e));
        if (is_op("(")) GB_RETURN_IF_ERROR(call_args(*f));
        e = std::move(f);
        GB_RETURN_IF_ERROR(taller(*e));
      } else if (is_name("is")) {
        const int line = next().line;
        auto t = make(Expr::Kind::kTest, line);
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        // `none`, `true` and `false` are names of tests here, not literals.
        GB_ASSIGN_OR_RETURN(std::string name, expect_name());
        if (!kTests.count(name)) return syntax_error(line, "unsupported test '" + name + "'");
        t->name = name;
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          GB_RETURN_IF_ERROR(call_args(*t));
        } else if (!at_end() && (peek().kind == Token::Kind::kString || peek().kind == Token::Kind::kInt ||
                                 peek().kind == Token::Kind::kFloat)) {
          GB_ASSIGN_OR_RETURN(ExprPtr arg, primary());  // `x is divisibleby 3`
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
        GB_RETURN_IF_ERROR(taller(*e));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> primary() {
    const Token tok = next();
    switch (tok.kind) {
      case Token::Kind::kInt: {
        auto e = make(Expr::Kind::kLiteral, tok.line);
        e->literal = Value::integer(tok.i);
        return e;
      }
      case Token::Kind::kFloat: {
        auto e = make(Expr::Kind::kLiteral, tok.line);
        e->literal = Value::number(tok.f);
        return e;
      }
      case Token::Kind::kString: {
        std::string s = tok.text;
        while (peek().kind == Token::Kind::kString) s += next().text;  // adjacent literals concatenate
        auto e = make(Expr::Kind::kLiteral, tok.line);
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Token::Kind::kName: {
        auto e = make(Expr::Kind::kLiteral, tok.line);
        if (tok.text == "true" || tok.text == "True") {
          e->literal = Value::boolean(true);
        } else if (tok.text == "false" || tok.text == "False") {
          e->literal = Value::boolean(false);
        } else if (tok.text == "none" || tok.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = tok.text;
        }
        return e;
      }
      case Token::Kind::kOp:
        if (tok.text == "(") {
          if (is_op(")")) {
            next();
            return make(Expr::Kind::kTuple, tok.line);
          }
          GB_ASSIGN_OR_RETURN(ExprPtr e, expression());
          if (is_op(",")) {
            auto t = make(Expr::Kind::kTuple, tok.line);
            t->args.push_back(std::move(e));
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              GB_ASSIGN_OR_RETURN(ExprPtr x, expression());
              t->args.push_back(std::move(x));
            }
            e = std::move(t);
          }
          GB_RETURN_IF_ERROR(expect_op(")"));
          return e;
        }
        if (tok.text == "[") {
          auto l = make(Expr::Kind::kList, tok.line);
          while (!is_op("]")) {
            GB_ASSIGN_OR_RETURN(ExprPtr x, expression());
            l->args.push_back(std::move(x));
            if (!is_op(",")) break;
            next();
          }
          GB_RETURN_IF_ERROR(expect_op("]"));
          return l;
        }
        if (tok.text == "{") {
          auto d = make(Expr::Kind::kDict, tok.line);
          while (!is_op("}")) {
            GB_ASSIGN_OR_RETURN(ExprPtr k, expression());
            GB_RETURN_IF_ERROR(expect_op(":"));
            GB_ASSIGN_OR_RETURN(ExprPtr v, expression());
            d->args.push_back(std::move(k));
            d->args.push_back(std::move(v));
            if (!is_op(",")) break;
            next();
          }
          GB_RETURN_IF_ERROR(expect_op("}"));
          return d;
        }
        [[fallthrough]];
      default:
        return syntax_error(tok.line, "unexpected " + describe(tok) + " in an expression");
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  std::map<std::string, int>* called_;  // function names called -> first line
};

// ---- statements ----

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Result<Body> parse_all() {
    GB_ASSIGN_OR_RETURN(Body body, parse_body({}));
    if (pos_ < segs_.size()) return syntax_error(segs_[pos_].line, "unexpected '{% " + keyword(segs_[pos_]) + " %}'");
    for (const auto& [name, line] : called_) {
      if (!kGlobals.count(name) && !macros_.count(name)) {
        return syntax_error(line, "unsupported function '" + name +
                                      "()' (not a global this engine "
                                      "provides nor a macro of the template)");
      }
    }
    return body;
  }

 private:
  static std::string keyword(const Segment& s) {
    const size_t b = s.content.find_first_not_of(" \t\r\n");
    if (b == std::string::npos) return "";
    size_t e = b;
    while (e < s.content.size() && (std::isalnum(static_cast<unsigned char>(s.content[e])) || s.content[e] == '_')) ++e;
    return s.content.substr(b, e - b);
  }

  // Parses until a block tag whose keyword is in `stop` (left unconsumed) or the end.
  Result<Body> parse_body(const std::set<std::string>& stop) {
    const Nest nest(depth_);
    if (nest.too_deep()) {
      return syntax_error(pos_ < segs_.size() ? segs_[pos_].line : 1,
                          "blocks nest deeper than " + std::to_string(kMaxTemplateNesting) + " levels");
    }
    Body body;
    while (pos_ < segs_.size()) {
      const Segment& s = segs_[pos_];
      if (s.kind == Segment::Kind::kText) {
        auto n = node(Node::Kind::kText, s.line);
        n->text = s.content;
        body.push_back(std::move(n));
        ++pos_;
        continue;
      }
      if (s.kind == Segment::Kind::kVar) {
        GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(s));
        GB_ASSIGN_OR_RETURN(ExprPtr e, p.expression());
        GB_RETURN_IF_ERROR(p.expect_end("the expression"));
        auto n = node(Node::Kind::kOutput, s.line);
        n->expr = std::move(e);
        body.push_back(std::move(n));
        ++pos_;
        continue;
      }
      const std::string kw = keyword(s);
      if (stop.count(kw)) return body;
      GB_ASSIGN_OR_RETURN(NodePtr n, statement(kw));
      if (n) body.push_back(std::move(n));
    }
    if (!stop.empty()) {
      std::string end;
      for (const auto& k : stop) {
        if (k.rfind("end", 0) == 0) end = k;
      }
      return syntax_error(segs_.empty() ? 1 : segs_.back().line, "the template ends before '{% " + end + " %}'");
    }
    return body;
  }

  static NodePtr node(Node::Kind k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
  }

  Result<ExprParser> expr_parser(const Segment& s, size_t skip_keyword = 0) {
    std::string content = s.content;
    if (skip_keyword) {
      const size_t b = content.find_first_not_of(" \t\r\n");
      content = content.substr(b + skip_keyword);
    }
    GB_ASSIGN_OR_RETURN(std::vector<Token> toks, tokenize(content, s.line));
    return ExprParser(std::move(toks), &called_);
  }

  Result<NodePtr> statement(const std::string& kw) {
    const Segment& s = segs_[pos_];
    const int line = s.line;
    if (kw == "if") {
      auto n = node(Node::Kind::kIf, line);
      std::string cur = "if";
      for (;;) {
        const Segment& head = segs_[pos_];
        if (cur == "else") {
          GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(head, 4));
          GB_RETURN_IF_ERROR(p.expect_end("'else'"));
          ++pos_;
          GB_ASSIGN_OR_RETURN(n->else_body, parse_body({"endif"}));
        } else {
          GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(head, cur.size()));
          GB_ASSIGN_OR_RETURN(ExprPtr cond, p.expression());
          GB_RETURN_IF_ERROR(p.expect_end("the condition"));
          ++pos_;
          GB_ASSIGN_OR_RETURN(Body b, parse_body({"elif", "else", "endif"}));
          n->branches.emplace_back(std::move(cond), std::move(b));
        }
        cur = keyword(segs_[pos_]);
        if (cur == "endif") break;
      }
      GB_RETURN_IF_ERROR(end_tag("endif"));
      return n;
    }
    if (kw == "for") {
      auto n = node(Node::Kind::kFor, line);
      GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(s, 3));
      const bool paren = p.is_op("(");
      if (paren) p.next();
      for (;;) {
        GB_ASSIGN_OR_RETURN(std::string t, p.expect_name());
        n->targets.push_back(t);
        if (!p.is_op(",")) break;
        p.next();
      }
      if (paren) GB_RETURN_IF_ERROR(p.expect_op(")"));
      if (!p.is_name("in")) return syntax_error(line, "expected 'in' in '{% for %}'");
      p.next();
      GB_ASSIGN_OR_RETURN(n->expr, p.iterable());
      if (p.is_name("if")) {
        p.next();
        GB_ASSIGN_OR_RETURN(n->filter, p.expression());
      }
      if (p.is_name("recursive")) return syntax_error(line, "unsupported construct 'for ... recursive'");
      GB_RETURN_IF_ERROR(p.expect_end("the loop header"));
      ++pos_;
      GB_ASSIGN_OR_RETURN(n->body, parse_body({"else", "endfor"}));
      if (keyword(segs_[pos_]) == "else") {
        ++pos_;
        GB_ASSIGN_OR_RETURN(n->else_body, parse_body({"endfor"}));
      }
      GB_RETURN_IF_ERROR(end_tag("endfor"));
      return n;
    }
    if (kw == "set") {
      GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(s, 3));
      auto n = node(Node::Kind::kSet, line);
      GB_ASSIGN_OR_RETURN(std::string first, p.expect_name());
      n->targets.push_back(first);
      if (p.is_op(".")) {
        p.next();
        GB_ASSIGN_OR_RETURN(n->attr, p.expect_name());
      }
      while (p.is_op(",")) {
        p.next();
        GB_ASSIGN_OR_RETURN(std::string t, p.expect_name());
        n->targets.push_back(t);
      }
      if (p.at_end()) {  // block set: {% set x %}...{% endset %}
        if (n->targets.size() != 1 || !n->attr.empty()) return syntax_error(line, "a block '{% set %}' takes one name");
        n->kind = Node::Kind::kSetBlock;
        ++pos_;
        GB_ASSIGN_OR_RETURN(n->body, parse_body({"endset"}));
        GB_RETURN_IF_ERROR(end_tag("endset"));
        return n;
      }
      GB_RETURN_IF_ERROR(p.expect_op("="));
      GB_ASSIGN_OR_RETURN(n->expr, p.tuple_or_expression());
      GB_RETURN_IF_ERROR(p.expect_end("the assignment"));
      ++pos_;
      return n;
    }
    if (kw == "macro") {
      GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(s, 5));
      auto n = node(Node::Kind::kMacro, line);
      GB_ASSIGN_OR_RETURN(n->name, p.expect_name());
      GB_RETURN_IF_ERROR(p.expect_op("("));
      while (!p.is_op(")")) {
        GB_ASSIGN_OR_RETURN(std::string param, p.expect_name());
        ExprPtr def;
        if (p.is_op("=")) {
          p.next();
          GB_ASSIGN_OR_RETURN(def, p.expression());
        }
        n->params.emplace_back(param, std::move(def));
        if (!p.is_op(",")) break;
        p.next();
      }
      GB_RETURN_IF_ERROR(p.expect_op(")"));
      GB_RETURN_IF_ERROR(p.expect_end("the macro header"));
      macros_.insert(n->name);
      ++pos_;
      GB_ASSIGN_OR_RETURN(n->body, parse_body({"endmacro"}));
      GB_RETURN_IF_ERROR(end_tag("endmacro"));
      return n;
    }
    if (kw == "break" || kw == "continue") {
      GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(s, kw.size()));
      GB_RETURN_IF_ERROR(p.expect_end("'" + kw + "'"));
      ++pos_;
      return node(kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line);
    }
    if (kw == "generation") {  // transformers' marker for assistant tokens: renders its body as is
      ++pos_;
      GB_ASSIGN_OR_RETURN(Body b, parse_body({"endgeneration"}));
      GB_RETURN_IF_ERROR(end_tag("endgeneration"));
      auto n = node(Node::Kind::kIf, line);
      auto always = std::make_unique<Expr>();
      always->kind = Expr::Kind::kLiteral;
      always->literal = Value::boolean(true);
      n->branches.emplace_back(std::move(always), std::move(b));
      return n;
    }
    static const std::set<std::string> kKnownEnds = {"endif",         "endfor", "endset", "endmacro",
                                                     "endgeneration", "elif",   "else"};
    if (kKnownEnds.count(kw)) return syntax_error(line, "'{% " + kw + " %}' without its opening statement");
    return syntax_error(line, "unsupported statement '{% " + (kw.empty() ? s.content : kw) + " %}'");
  }

  Status end_tag(const std::string& kw) {
    GB_ASSIGN_OR_RETURN(ExprParser p, expr_parser(segs_[pos_], kw.size()));
    GB_RETURN_IF_ERROR(p.expect_end("'" + kw + "'"));
    ++pos_;
    return ok_status();
  }

  std::vector<Segment> segs_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::map<std::string, int> called_;
  std::set<std::string> macros_;
};

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  GB_ASSIGN_OR_RETURN(std::vector<Segment> segs, split_template(source));
  Parser parser(std::move(segs));
  GB_ASSIGN_OR_RETURN(Body body, parser.parse_all());
  Template t;
  t.body_ = std::make_shared<Body>(std::move(body));
  return t;
}

}  // namespace genbridge::text::jinja
