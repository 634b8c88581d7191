#pragma once
// Internal: strict JSON parsing for checkpoint files (config.json, safetensors headers, index files).

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace genbridge::model::detail {

// Parses `text`; a duplicate key in any object is an error (JSON parsers otherwise keep one silently,
// which lets two entries alias one name). On failure returns nullopt and sets `*error` to a phrase such as
// "malformed JSON: parse error at line 1, column 11: ..." or "duplicate key 'hidden_size'".
std::optional<nlohmann::json> parse_json_strict(std::string_view text, std::string* error);

// The value as it would be written in JSON, shortened to `max_chars` for messages.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace genbridge::model::detail
