#include "text/utf8.h"

#include <utf8proc.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

namespace genbridge::text {

Utf8Step utf8_step(std::string_view s, size_t pos) {
  const auto b = [&](size_t i) { return static_cast<uint8_t>(s[pos + i]); };
  const uint8_t b0 = b(0);
  if (b0 < 0x80) return {Utf8Step::Kind::kValid, 1, b0};
  size_t need;
  char32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (excludes overlongs and surrogates)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Step::Kind::kInvalid, 1, 0};
  }
  for (size_t i = 1; i < need; ++i) {
    if (pos + i >= s.size()) return {Utf8Step::Kind::kIncomplete, i, 0};
    const uint8_t c = b(i);
    const bool ok = i == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return {Utf8Step::Kind::kInvalid, i, 0};
    cp = (cp << 6) | (c & 0x3F);
  }
  return {Utf8Step::Kind::kValid, need, cp};
}

Status validate_utf8(std::string_view s, std::string_view what) {
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Step st = utf8_step(s, pos);
    if (st.kind == Utf8Step::Kind::kValid) {
      pos += st.length;
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned>(static_cast<uint8_t>(s[pos])));
    const char* why = st.kind == Utf8Step::Kind::kIncomplete ? "a multi-byte sequence cut off by the end of the input"
                      : st.length == 1                       ? "not a valid first byte here"
                                                             : "a multi-byte sequence broken by a later byte";
    return invalid_argument(std::string(what) + ": input is not valid UTF-8: byte " + hex + " at byte offset " +
                            std::to_string(pos) + " starts " + why);
  }
  return ok_status();
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Step st = utf8_step(s, pos);
    if (st.kind == Utf8Step::Kind::kValid) {
      out.append(s.substr(pos, st.length));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += st.length;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t next_code_point(std::string_view s, size_t& pos) {
  const Utf8Step st = utf8_step(s, pos);
  GB_CHECK(st.kind == Utf8Step::Kind::kValid, "next_code_point needs valid UTF-8");
  pos += st.length;
  return st.code_point;
}

bool is_white_space(char32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85) return true;
  if (cp < 0xA0) return false;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

namespace {

Result<std::string> utf8proc_normalize(std::string_view s, int options) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  if (n < 0) return invalid_argument(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

}  // namespace

Result<std::string> normalize_utf8(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  // Only the non-ASCII stretches need utf8proc. Cutting right before an ASCII character is safe in every
  // normal form: ASCII characters are starters (combining class 0), have no decomposition and are never the
  // second half of a composition, so nothing reorders or composes across the cut. Each stretch takes the
  // ASCII character before it, which a following combining mark may compose with ("e" + U+0301).
  std::string out;
  size_t done = 0;  // s[0, done) is in `out`
  for (size_t i = 0; i < s.size();) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t begin = i > done ? i - 1 : i;
    size_t end = i;
    while (end < s.size() && static_cast<uint8_t>(s[end]) >= 0x80) ++end;
    if (done == 0 && out.empty()) out.reserve(s.size() + 16);
    out.append(s.substr(done, begin - done));
    GB_ASSIGN_OR_RETURN(std::string part, utf8proc_normalize(s.substr(begin, end - begin), options));
    out += part;
    done = end;
    i = end;
  }
  if (done == 0) return std::string(s);  // all ASCII: every normal form of ASCII is itself
  out.append(s.substr(done));
  return out;
}

}  // namespace genbridge::text
