#include "runtime/checkpoint/json_util.h"

#include <fmt/format.h>

#include <cstring>
#include <set>
#include <vector>

namespace genbridge::model::detail {
namespace {

using json = nlohmann::json;

// Parses `text` strictly (nothing but JSON whitespace after the value), refusing duplicate keys.
std::optional<json> parse_no_duplicates(std::string_view text, std::string* error) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && !open_objects.back().insert(parsed.get<std::string>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    json j = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
    if (!duplicate.empty()) {
      *error = "duplicate key '" + duplicate + "'";
      return std::nullopt;
    }
    return j;
  } catch (const json::exception& e) {
    // nlohmann messages start with "[json.exception.parse_error.101] "; keep the sentence after it.
    std::string what = e.what();
    if (const size_t p = what.find("] "); what.rfind("[json.exception", 0) == 0 && p != std::string::npos) {
      what = what.substr(p + 2);
    }
    *error = "malformed JSON: " + what;
    return std::nullopt;
  }
}

bool is_json_whitespace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// One past the bracket that closes the object or array `text` starts with (after whitespace), or npos when
// the text does not start with one or never closes it. Only brackets outside strings count.
size_t value_end(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && is_json_whitespace(text[i])) ++i;
  if (i == text.size() || (text[i] != '{' && text[i] != '[')) return std::string_view::npos;
  int64_t depth = 0;
  bool in_string = false, escaped = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// "'x' (0x78)" for a printable byte, "0x0a" otherwise.
std::string describe_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x21 && u < 0x7f) return fmt::format("'{}' (0x{:02x})", c, u);
  return fmt::format("byte 0x{:02x}", u);
}

// The first byte after `end` that the padding rule does not allow, or npos.
size_t first_bad_padding(std::string_view text, size_t end, JsonPadding padding) {
  for (size_t i = end; i < text.size(); ++i) {
    if (padding == JsonPadding::kSpaces ? text[i] != ' ' : !is_json_whitespace(text[i])) return i;
  }
  return std::string_view::npos;
}

std::string trailing_error(std::string_view text, size_t end, size_t bad, const JsonTextRules& rules) {
  return fmt::format("unexpected {} at byte offset {} after the end of the JSON {}; only {} may follow it",
                     describe_byte(text[bad]), rules.file_offset + bad, text[end - 1] == '}' ? "object" : "array",
                     rules.padding == JsonPadding::kSpaces ? "spaces (0x20)" : "whitespace");
}

}  // namespace

std::optional<json> parse_json_strict(std::string_view text, std::string* error, const JsonTextRules& rules) {
  // NUL is never valid JSON, and nlohmann's lexer reads it as the end of input: check before parsing.
  if (const void* nul = std::memchr(text.data(), '\0', text.size())) {
    const size_t at = static_cast<size_t>(static_cast<const char*>(nul) - text.data());
    *error = fmt::format("NUL byte (0x00) at byte offset {}; JSON text cannot contain one", rules.file_offset + at);
    return std::nullopt;
  }
  std::optional<json> j = parse_no_duplicates(text, error);
  const size_t end = value_end(text);
  if (j) {
    if (rules.padding == JsonPadding::kSpaces && end != std::string_view::npos) {
      if (const size_t bad = first_bad_padding(text, end, rules.padding); bad != std::string_view::npos) {
        *error = trailing_error(text, end, bad, rules);
        return std::nullopt;
      }
    }
    return j;
  }
  // A value followed by garbage: name the first byte after it, with its offset (nlohmann's message gives a
  // line and column and says only "expected end of input").
  if (end != std::string_view::npos) {
    const size_t bad = first_bad_padding(text, end, rules.padding);
    std::string prefix_error;
    if (bad != std::string_view::npos && parse_no_duplicates(text.substr(0, end), &prefix_error)) {
      *error = trailing_error(text, end, bad, rules);
    }
  }
  return std::nullopt;
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace genbridge::model::detail
