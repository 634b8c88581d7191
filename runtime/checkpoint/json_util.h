#pragma once
// Internal: strict JSON parsing for checkpoint files (config.json, safetensors headers, index files).

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace genbridge::model::detail {

// What may follow the JSON value in a text.
enum class JsonPadding : uint8_t {
  kWhitespace,  // JSON whitespace (space, tab, CR, LF): config.json, the shard index
  kSpaces,      // spaces (0x20) only: the safetensors header, whose format allows only that padding
};

struct JsonTextRules {
  uint64_t file_offset = 0;  // where the text starts in its file, so messages give file byte offsets
  JsonPadding padding = JsonPadding::kWhitespace;
};

// Parses `text`; a duplicate key in any object is an error (JSON parsers otherwise keep one silently,
// which lets two entries alias one name), and so is a NUL byte anywhere (nlohmann's parser takes NUL for
// the end of input and would ignore whatever follows) or anything but `rules.padding` after the value.
// On failure returns nullopt and sets `*error` to a phrase such as
// "malformed JSON: parse error at line 1, column 11: ...", "duplicate key 'hidden_size'",
// "NUL byte (0x00) at byte offset 77; JSON text cannot contain one" or
// "unexpected 'x' (0x78) at byte offset 80 after the end of the JSON object; only whitespace may follow it".
std::optional<nlohmann::json> parse_json_strict(std::string_view text, std::string* error,
                                                const JsonTextRules& rules = {});

// The value as it would be written in JSON, shortened to `max_chars` for messages.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace genbridge::model::detail
