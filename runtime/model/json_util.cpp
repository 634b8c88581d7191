#include "runtime/model/json_util.h"

#include <set>
#include <vector>

namespace genbridge::model::detail {

std::optional<nlohmann::json> parse_json_strict(std::string_view text, std::string* error) {
  using json = nlohmann::json;
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

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars) + "...";
  return s;
}

}  // namespace genbridge::model::detail
