#include "tools/serve/generation_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/engine/sampler.h"
#include "text/json_text.h"

namespace genbridge::serve {

namespace {

using nlohmann::json;

// The sampling keys over `defaults`; every other key is left alone when `strict` is false (a
// generation_config.json holds many) and refused when true (the override flag).
Status read_defaults(const json& j, const std::string& where, bool strict, SamplingDefaults* d) {
  const auto fail = [&](const std::string& key, const std::string& rule) {
    return invalid_argument(fmt::format("{}: \"{}\" is {}; it must be {}", where, key, j[key].dump(), rule));
  };
  const auto number = [&](const char* key, const engine::FloatRange& range, std::optional<float>* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return ok_status();
    if (!j[key].is_number() || !range.contains(j[key].get<double>())) return fail(key, range.rule());
    *out = j[key].get<float>();
    return ok_status();
  };
  GB_RETURN_IF_ERROR(number("temperature", engine::kTemperatureRange.with_hi(2.f), &d->temperature));
  GB_RETURN_IF_ERROR(number("top_p", engine::kTopPRange, &d->top_p));
  GB_RETURN_IF_ERROR(number("min_p", engine::kMinPRange, &d->min_p));
  GB_RETURN_IF_ERROR(number("repetition_penalty", engine::kRepetitionPenaltyRange, &d->repetition_penalty));
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    const json& v = j["top_k"];
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > engine::kMaxTopK) {
      return fail("top_k", fmt::format("-1 or 0 (no limit) or an integer in [1, {}]", engine::kMaxTopK));
    }
    d->top_k = static_cast<int>(std::max<int64_t>(v.get<int64_t>(), 0));
  }
  if (j.contains("max_new_tokens") && !j["max_new_tokens"].is_null()) {
    const json& v = j["max_new_tokens"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1) return fail("max_new_tokens", "an integer >= 1");
    d->max_tokens = v.get<int64_t>();
  }
  if (strict) {
    for (const auto& [key, value] : j.items()) {
      static constexpr std::string_view kKeys[] = {"temperature",        "top_p",         "top_k", "min_p",
                                                   "repetition_penalty", "max_new_tokens"};
      if (std::find(std::begin(kKeys), std::end(kKeys), key) == std::end(kKeys)) {
        return invalid_argument(
            fmt::format("{}: \"{}\" is not a sampling default (temperature, top_p, top_k, min_p, "
                        "repetition_penalty, max_new_tokens)",
                        where, key));
      }
    }
  }
  return ok_status();
}

}  // namespace

Result<GenerationConfig> parse_generation_config(std::string_view json_text, std::string_view source) {
  GB_ASSIGN_OR_RETURN(json j, text::parse_json_text<json>(json_text, source));
  const std::string where(source);
  if (!j.is_object()) return invalid_argument(where + ": $ must be a JSON object");
  GenerationConfig c;
  c.source = where;
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    json ids = j["eos_token_id"];
    if (!ids.is_array()) ids = json::array({ids});
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        return invalid_argument(fmt::format("{}: \"eos_token_id\" is {}; it must be a token id or a list of them",
                                            where, j["eos_token_id"].dump()));
      }
      c.eos_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  GB_RETURN_IF_ERROR(read_defaults(j, where, /*strict=*/false, &c.defaults));
  return c;
}

Result<GenerationConfig> read_generation_config(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / kGenerationConfigFile;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return GenerationConfig{};
  std::ifstream in(file, std::ios::binary);
  if (!in) return invalid_argument("cannot read " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse_generation_config(text.str(), file.string());
}

Status override_generation_config(std::string_view json_text, std::string_view flag, SamplingDefaults* defaults) {
  GB_ASSIGN_OR_RETURN(json j, text::parse_json_text<json>(json_text, flag));
  if (!j.is_object()) return invalid_argument(fmt::format("{}: the value must be a JSON object", flag));
  return read_defaults(j, std::string(flag), /*strict=*/true, defaults);
}

std::string describe_generation_config(const GenerationConfig& c) {
  std::vector<std::string> parts;
  const SamplingDefaults& d = c.defaults;
  if (d.temperature) parts.push_back(fmt::format("temperature {}", *d.temperature));
  if (d.top_p) parts.push_back(fmt::format("top_p {}", *d.top_p));
  if (d.top_k) parts.push_back(fmt::format("top_k {}", *d.top_k));
  if (d.min_p) parts.push_back(fmt::format("min_p {}", *d.min_p));
  if (d.repetition_penalty) parts.push_back(fmt::format("repetition_penalty {}", *d.repetition_penalty));
  if (d.max_tokens) parts.push_back(fmt::format("max_tokens {}", *d.max_tokens));
  return fmt::format("sampling defaults: {}", parts.empty() ? "the API's" : fmt::format("{}", fmt::join(parts, ", ")));
}

}  // namespace genbridge::serve
