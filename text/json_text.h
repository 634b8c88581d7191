#pragma once
// Parsing a whole JSON document held in memory, for the text loaders (tokenizer.json, tokenizer_config.json).

#include <string>
#include <string_view>

#include "genbridge/core/status.h"

namespace genbridge::text {

// `json_text` parsed as one JSON document of type Json (nlohmann::json or nlohmann::ordered_json);
// InvalidArgument "<source>: malformed JSON: <parser message>" otherwise. Does not retain `json_text`.
template <class Json>
Result<Json> parse_json_text(std::string_view json_text, std::string_view source) {
  try {
    return Json::parse(json_text.begin(), json_text.end());
  } catch (const typename Json::exception& e) {
    return invalid_argument(std::string(source) + ": malformed JSON: " + e.what());
  }
}

}  // namespace genbridge::text
