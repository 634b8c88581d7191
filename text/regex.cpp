#include "text/regex.h"

#include <pcre2.h>

namespace genbridge::text {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

constexpr const char* kWhiteSpaceClassBody = "\\t-\\r\\x20\\x{85}\\p{Z}";
constexpr const char* kWordClassBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

// One JIT stack per thread (a JIT stack must not be used by two matches at once). 8 MiB lets look-ahead
// patterns run over megabyte-long whitespace runs.
struct JitContext {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  JitContext() {
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (stack && context) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~JitContext() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Result<std::string> translate_oniguruma_pattern(std::string_view p, std::string_view where) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      const char* body = (e == 's' || e == 'S')   ? kWhiteSpaceClassBody
                         : (e == 'w' || e == 'W') ? kWordClassBody
                                                  : nullptr;
      if (!body) {
        out += c;
        out += e;
        continue;
      }
      const bool negated = e == 'S' || e == 'W';
      if (in_class && negated) {
        return invalid_argument(std::string(where) + ": '\\" + e +
                                "' inside a character class is not supported (pattern " + std::string(p) + ")");
      }
      out += in_class ? std::string(body) : std::string(negated ? "[^" : "[") + body + "]";
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Result<Regex> Regex::compile(std::string_view pattern, std::string_view where) {
  GB_ASSIGN_OR_RETURN(std::string translated, translate_oniguruma_pattern(pattern, where));
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code) {
    return invalid_argument(std::string(where) + ": the regular expression does not compile (PCRE2: " +
                            pcre2_message(err) + " at offset " + std::to_string(offset) + " of " + translated + ")");
  }
  auto owned = std::make_shared<Code>();
  owned->code = code;
  Regex r;
  r.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  r.code_ = std::move(owned);
  r.pattern_ = std::string(pattern);
  r.where_ = std::string(where);
  return r;
}

Status Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  thread_local JitContext jit;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  GB_CHECK(md != nullptr, "pcre2_match_data_create_from_pattern failed");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  bool have_last = false;
  size_t last_end = 0;
  Status status;
  while (start <= text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, jit.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = resource_exhausted(where_ + ": the regular expression failed on a " + std::to_string(text.size()) +
                                  "-byte input (PCRE2: " + pcre2_message(rc) + ")");
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (s == e && have_last && last_end == e) {
      if (start >= text.size()) break;
      size_t step = 1;
      while (start + step < text.size() && (static_cast<uint8_t>(text[start + step]) & 0xC0) == 0x80) ++step;
      start += step;
      continue;
    }
    out.emplace_back(s, e);
    have_last = true;
    last_end = e;
    start = e;
  }
  pcre2_match_data_free(md);
  return status;
}

}  // namespace genbridge::text
