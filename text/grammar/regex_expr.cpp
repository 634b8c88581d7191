#include "text/grammar/regex_expr.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <vector>

namespace genbridge::text::grammar {

namespace {

using Expr = GrammarBuilder::Expr;
using Ranges = std::vector<std::pair<char32_t, char32_t>>;  // sorted, disjoint, inclusive

constexpr char32_t kMaxCp = 0x10FFFF;
constexpr int kMaxGroupNesting = 128;

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  char32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  return out;
}

const Ranges kDigit{{'0', '9'}};
const Ranges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace{{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space

class Parser {
 public:
  Parser(GrammarBuilder& b, std::string_view p, const CharEncoder& enc, int max_repeat)
      : b_(b), src_(p), enc_(enc), max_repeat_(max_repeat) {
    // Decode to code points, remembering byte offsets for messages.
    for (size_t i = 0; i < p.size();) {
      const unsigned char c = static_cast<unsigned char>(p[i]);
      char32_t cp = c;
      int n = 1;
      if (c >= 0xF0) {
        cp = c & 0x07;
        n = 4;
      } else if (c >= 0xE0) {
        cp = c & 0x0F;
        n = 3;
      } else if (c >= 0xC0) {
        cp = c & 0x1F;
        n = 2;
      }
      for (int k = 1; k < n && i + k < p.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(p[i + k]) & 0x3F);
      cps_.push_back(cp);
      offs_.push_back(i);
      i += n;
    }
    offs_.push_back(p.size());
  }

  Result<Expr> parse() {
    size_t end = cps_.size();
    if (end > 0 && cps_[0] == '^') pos_ = 1;
    if (end > pos_ && cps_[end - 1] == '$' && !(end >= 2 && cps_[end - 2] == '\\')) trailing_dollar_ = true;
    auto e = alternation(0);
    if (!e.ok()) return e;
    if (trailing_dollar_ && pos_ == cps_.size() - 1) ++pos_;
    if (pos_ != cps_.size()) return error(fmt::format("unexpected '{}'", piece(pos_)));
    return e;
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument(
        fmt::format("pattern {}: {} at offset {}", shown(), what, offs_[std::min(pos_, cps_.size())]));
  }
  std::string shown() const {
    std::string s(src_.substr(0, 60));
    if (src_.size() > 60) s += "...";
    return "\"" + s + "\"";
  }
  std::string piece(size_t i) const { return std::string(src_.substr(offs_[i], offs_[i + 1] - offs_[i])); }
  bool at_end() const { return pos_ >= cps_.size() || (trailing_dollar_ && pos_ == cps_.size() - 1); }
  char32_t peek() const { return cps_[pos_]; }

  Expr chars(const Ranges& r) {
    std::vector<Expr> options;
    for (auto [lo, hi] : r) options.push_back(enc_ ? enc_(b_, lo, hi) : b_.codepoints(lo, hi));
    return b_.alt(std::move(options));
  }

  Result<Expr> alternation(int depth) {
    if (depth > kMaxGroupNesting) return error(fmt::format("groups nest deeper than {}", kMaxGroupNesting));
    std::vector<Expr> options;
    for (;;) {
      auto s = sequence(depth);
      if (!s.ok()) return s;
      options.push_back(*s);
      if (!at_end() && peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return b_.alt(std::move(options));
  }

  Result<Expr> sequence(int depth) {
    std::vector<Expr> parts;
    while (!at_end() && peek() != '|' && peek() != ')') {
      auto a = atom(depth);
      if (!a.ok()) return a;
      auto q = quantified(*a);
      if (!q.ok()) return q;
      parts.push_back(*q);
    }
    if (parts.empty()) return b_.empty();
    return b_.seq(std::move(parts));
  }

  Result<int> number() {
    int64_t v = 0;
    const size_t start = pos_;
    while (pos_ < cps_.size() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > max_repeat_) return Status(error(fmt::format("a repetition count exceeds {}", max_repeat_)));
      ++pos_;
    }
    if (pos_ == start) return Status(error("a repetition count is missing"));
    return static_cast<int>(v);
  }

  Result<Expr> quantified(Expr e) {
    while (!at_end()) {
      int lo = 0, hi = 0;
      const char32_t c = peek();
      if (c == '*') {
        lo = 0, hi = GrammarBuilder::kUnbounded;
        ++pos_;
      } else if (c == '+') {
        lo = 1, hi = GrammarBuilder::kUnbounded;
        ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1;
        ++pos_;
      } else if (c == '{') {
        const size_t save = pos_;
        ++pos_;
        if (pos_ >= cps_.size() || !(peek() >= '0' && peek() <= '9')) {  // a literal '{' (as both engines read it)
          pos_ = save;
          return e;
        }
        auto a = number();
        if (!a.ok()) return a.status();
        lo = hi = *a;
        if (pos_ < cps_.size() && peek() == ',') {
          ++pos_;
          if (pos_ < cps_.size() && peek() == '}') {
            hi = GrammarBuilder::kUnbounded;
          } else {
            auto bnum = number();
            if (!bnum.ok()) return bnum.status();
            hi = *bnum;
          }
        }
        if (pos_ >= cps_.size() || peek() != '}') return error("'{' without its closing '}'");
        ++pos_;
        if (hi != GrammarBuilder::kUnbounded && hi < lo) return error(fmt::format("{{{},{}}} counts down", lo, hi));
      } else {
        return e;
      }
      if (!at_end() && peek() == '?') {
        ++pos_;  // lazy: the same full matches
      } else if (!at_end() && peek() == '+') {
        return error("a possessive quantifier is not supported");
      }
      e = b_.repeat(e, lo, hi);
    }
    return e;
  }

  // One escape after '\' (pos_ at the character after it): a class (ranges) or one code point.
  Result<Ranges> escape(bool in_class) {
    if (pos_ >= cps_.size()) return Status(error("the pattern ends with '\\'"));
    const char32_t c = peek();
    ++pos_;
    switch (c) {
      case 'd':
        return kDigit;
      case 'D':
        return complement(kDigit);
      case 'w':
        return kWord;
      case 'W':
        return complement(kWord);
      case 's':
        return kSpace;
      case 'S':
        return complement(kSpace);
      case 'n':
        return Ranges{{'\n', '\n'}};
      case 't':
        return Ranges{{'\t', '\t'}};
      case 'r':
        return Ranges{{'\r', '\r'}};
      case 'f':
        return Ranges{{'\f', '\f'}};
      case 'v':
        return Ranges{{'\v', '\v'}};
      case '0':
        return Ranges{{0, 0}};
      case 'x':
      case 'u': {
        char32_t v = 0;
        int n = c == 'x' ? 2 : 4;
        bool braces = false;
        if (c == 'u' && pos_ < cps_.size() && peek() == '{') {
          braces = true;
          ++pos_;
          n = 6;
        }
        int got = 0;
        while (got < n && pos_ < cps_.size() && isxdigit(static_cast<int>(peek())) && peek() < 128) {
          const char32_t d = peek();
          v = v * 16 + (d <= '9' ? d - '0' : (d | 0x20) - 'a' + 10);
          ++pos_;
          ++got;
        }
        if (braces) {
          if (pos_ >= cps_.size() || peek() != '}' || got == 0) return Status(error("a \\u{...} escape is malformed"));
          ++pos_;
        } else if (got != n) {
          return Status(error(fmt::format("\\{} needs {} hex digits", static_cast<char>(c), n)));
        }
        if (v > kMaxCp || (v >= 0xD800 && v <= 0xDFFF)) {
          return Status(error(
              fmt::format("\\{} names U+{:04X}, not a character", static_cast<char>(c), static_cast<uint32_t>(v))));
        }
        return Ranges{{v, v}};
      }
      case 'b':
        if (in_class) return Ranges{{'\b', '\b'}};
        [[fallthrough]];
      case 'B':
        return Status(error(fmt::format("\\{} (a word boundary) is not supported", static_cast<char>(c))));
      default:
        if ((c >= '1' && c <= '9') || c == 'k') return Status(error("a backreference is not supported"));
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
          return Status(error(fmt::format("the escape \\{} is not supported", static_cast<char>(c))));
        }
        return Ranges{{c, c}};  // escaped punctuation (or any other character) stands for itself
    }
  }

  Result<Ranges> char_class() {
    // pos_ after '['.
    bool negate = false;
    if (pos_ < cps_.size() && peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    for (;;) {
      if (pos_ >= cps_.size()) return Status(error("'[' without its closing ']'"));
      char32_t c = peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      Ranges item;
      ++pos_;
      if (c == '\\') {
        auto e = escape(true);
        if (!e.ok()) return e;
        item = *e;
      } else if (c == '[' && pos_ < cps_.size() && peek() == ':') {
        return Status(error("POSIX classes [:...:] are not supported"));
      } else {
        item = {{c, c}};
      }
      // A range a-b (a single character on each side).
      if (item.size() == 1 && item[0].first == item[0].second && pos_ + 1 < cps_.size() && peek() == '-' &&
          cps_[pos_ + 1] != ']') {
        ++pos_;
        char32_t hi = peek();
        ++pos_;
        if (hi == '\\') {
          auto e = escape(true);
          if (!e.ok()) return e;
          if (e->size() != 1 || (*e)[0].first != (*e)[0].second) return Status(error("a range ends in a class"));
          hi = (*e)[0].first;
        }
        if (hi < item[0].first) return Status(error("a class range runs backwards"));
        item = {{item[0].first, hi}};
      }
      r.insert(r.end(), item.begin(), item.end());
    }
    r = normalize(std::move(r));
    return negate ? complement(r) : r;
  }

  Result<Expr> atom(int depth) {
    const char32_t c = peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (pos_ < cps_.size() && peek() == '?') {
          ++pos_;
          if (pos_ < cps_.size() && peek() == ':') {
            ++pos_;
          } else if (pos_ < cps_.size() && (peek() == '<' || peek() == 'P')) {
            if (peek() == 'P') ++pos_;
            if (pos_ >= cps_.size() || peek() != '<') return error("a group name is malformed");
            if (pos_ + 1 < cps_.size() && (cps_[pos_ + 1] == '=' || cps_[pos_ + 1] == '!')) {
              return error("lookbehind is not supported");
            }
            while (pos_ < cps_.size() && peek() != '>') ++pos_;
            if (pos_ >= cps_.size()) return error("a group name is not closed");
            ++pos_;
          } else if (pos_ < cps_.size() && (peek() == '=' || peek() == '!')) {
            return error("lookahead is not supported");
          } else {
            return error("this group syntax (inline flags?) is not supported");
          }
        }
        auto e = alternation(depth + 1);
        if (!e.ok()) return e;
        if (pos_ >= cps_.size() || peek() != ')') return error("'(' without its closing ')'");
        ++pos_;
        return e;
      }
      case ')':
        --pos_;
        return error("')' without its opening '('");
      case '[': {
        auto r = char_class();
        if (!r.ok()) return r.status();
        return chars(*r);
      }
      case '.':
        return chars(complement({{'\n', '\n'}}));
      case '\\': {
        auto r = escape(false);
        if (!r.ok()) return r.status();
        return chars(*r);
      }
      case '^':
        --pos_;
        return error("'^' is supported at the start of the pattern only");
      case '$':
        --pos_;
        return error("'$' is supported at the end of the pattern only");
      case '*':
      case '+':
      case '?':
        --pos_;
        return error(fmt::format("'{}' repeats nothing", static_cast<char>(c)));
      default:
        return chars({{c, c}});
    }
  }

  GrammarBuilder& b_;
  std::string_view src_;
  const CharEncoder& enc_;
  int max_repeat_;
  std::vector<char32_t> cps_;
  std::vector<size_t> offs_;
  size_t pos_ = 0;
  bool trailing_dollar_ = false;
};

}  // namespace

Result<GrammarBuilder::Expr> regex_expr(GrammarBuilder& b, std::string_view pattern, const CharEncoder& encode,
                                        int max_repeat) {
  Parser p(b, pattern, encode, max_repeat);
  return p.parse();
}

}  // namespace genbridge::text::grammar
