#pragma once
// Internal: typed reads of config.json keys with messages naming the source, the key and the rule. Shared
// by the Qwen parser (config.cpp) and the DeepSeek parser (deepseek_config.cpp).

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"
#include "runtime/checkpoint/json_util.h"

namespace genbridge::model::detail {

// Every size in a config must fit comfortably in int64 products (vocab * hidden, heads * head_dim, ...).
inline constexpr int64_t kMaxConfigSize = int64_t{1} << 24;

// Reads typed keys of one config.json object; every error names the source, the key and the rule.
class ConfigReader {
 public:
  using json = nlohmann::json;
  // `prefix` is put before every key a message names ("text_config." for a nested object).
  ConfigReader(const json& j, std::string_view source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  std::string_view source() const { return source_; }
  const json* find(std::string_view key) const {
    auto it = j_.find(std::string(key));
    if (it == j_.end() || it->is_null()) return nullptr;  // HF writes null for "not set"
    return &*it;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }

  Status missing(std::string_view key) const {
    return invalid_argument(fmt::format("{}: missing required key '{}{}'", source_, prefix_, key));
  }
  Status bad(std::string_view key, const json& v, std::string_view rule) const {
    return invalid_argument(fmt::format("{}: {}{} = {}: {}", source_, prefix_, key, json_excerpt(v), rule));
  }

  // An integer (JSON integer, not a float or bool); absent keys keep *out unless required.
  Status get_int(std::string_view key, bool required, int64_t* out) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : ok_status();
    if (v->is_number_unsigned()) {
      if (v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return bad(key, *v, "must fit in a 64-bit integer");
      *out = static_cast<int64_t>(v->get<uint64_t>());
      return ok_status();
    }
    if (v->is_number_integer()) {
      *out = v->get<int64_t>();
      return ok_status();
    }
    return bad(key, *v, "must be an integer");
  }
  Status get_double(std::string_view key, bool required, double* out) const {
    const json* v = find(key);
    if (!v) return required ? missing(key) : ok_status();
    if (!v->is_number()) return bad(key, *v, "must be a number");
    *out = v->get<double>();
    return ok_status();
  }
  Status get_bool(std::string_view key, bool* out) const {
    const json* v = find(key);
    if (!v) return ok_status();
    if (!v->is_boolean()) return bad(key, *v, "must be true or false");
    *out = v->get<bool>();
    return ok_status();
  }

 private:
  const json& j_;
  std::string_view source_;
  std::string prefix_;
};

// "[1, 2, 3]": a list of integers as messages show it.
inline std::string int_list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

inline Status bad_config_value(std::string_view source, std::string_view key, const std::string& value,
                               std::string_view rule) {
  return invalid_argument(fmt::format("{}: {} = {}: {}", source, key, value, rule));
}

// `v` in [min, kMaxConfigSize] (min is 0 or 1).
inline Status check_config_size(std::string_view source, std::string_view key, int64_t v, int64_t min) {
  if (v < min || v > kMaxConfigSize) {
    return bad_config_value(source, key, std::to_string(v),
                            min == 0 ? fmt::format("must be a non-negative integer no larger than {}", kMaxConfigSize)
                                     : fmt::format("must be a positive integer no larger than {}", kMaxConfigSize));
  }
  return ok_status();
}

// A positive config number the forward pass uses in fp32 (an epsilon, RoPE's theta, a scaling factor): it
// must stay finite and non-zero once rounded to fp32 (beyond 3.4e38 it becomes inf, which overflows every
// activation it touches).
inline Status check_fp32_positive(std::string_view source, std::string_view key, double v) {
  if (!(v >= static_cast<double>(std::numeric_limits<float>::denorm_min())) ||
      !(v <= static_cast<double>(std::numeric_limits<float>::max()))) {
    return bad_config_value(source, key, fmt::format("{}", v),
                            "must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass uses it in fp32)");
  }
  return ok_status();
}

}  // namespace genbridge::model::detail
