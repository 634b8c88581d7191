#include "tools/flags.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

namespace genbridge::tools {
namespace {

std::string shown(std::string_view text) { return text.empty() ? std::string("''") : std::string(text); }

// A number as the help text and messages print it: 30 not 30.000000, 0.001 not 1e-03.
std::string number_text(double v) { return fmt::format("{}", v); }

std::string real_rule(double lo, double hi, bool lo_open, std::string_view what) {
  if (std::isinf(hi)) return fmt::format("{} {} {}", what, lo_open ? ">" : ">=", number_text(lo));
  return fmt::format("{} in {}{}, {}]", what, lo_open ? "(" : "[", number_text(lo), number_text(hi));
}

std::string with_default(std::string help, std::string_view rule, std::string_view default_text) {
  help += "\n";
  help += rule;
  if (!default_text.empty()) help += fmt::format(". Default: {}", default_text);
  return help;
}

[[noreturn]] void throw_usage(const Status& s) { throw CLI::ValidationError(s.message()); }

}  // namespace

Result<int64_t> parse_int(std::string_view flag, std::string_view text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
    return invalid_argument(fmt::format("{} {}: expected an integer in [{}, {}]", flag, shown(text), lo, hi));
  }
  return v;
}

Result<uint64_t> parse_uint64(std::string_view flag, std::string_view text) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return invalid_argument(
        fmt::format("{} {}: expected an integer in [0, {}]", flag, shown(text), std::numeric_limits<uint64_t>::max()));
  }
  return v;
}

Result<double> parse_real(std::string_view flag, std::string_view text, double lo, double hi, bool lo_open,
                          std::string_view what) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const bool in_range = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !in_range) {
    return invalid_argument(fmt::format("{} {}: expected {}", flag, shown(text), real_rule(lo, hi, lo_open, what)));
  }
  return v;
}

Result<float> parse_float(std::string_view flag, std::string_view text, const engine::FloatRange& range) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !range.contains(v)) {
    return invalid_argument(fmt::format("{} {}: expected {}", flag, shown(text), range.rule()));
  }
  return static_cast<float>(v);
}

Result<std::vector<int32_t>> parse_token_list(std::string_view flag, std::string_view text) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  auto fail = [&](const std::string& why) {
    return invalid_argument(
        fmt::format("{} {}: {}; expected comma-separated token ids in [0, {}]", flag, shown(text), why, kMax));
  };
  if (text.empty()) return fail("the prompt is empty");
  std::vector<int32_t> ids;
  size_t begin = 0;
  for (int item = 1;; ++item) {
    const size_t comma = text.find(',', begin);
    const std::string_view part =
        text.substr(begin, comma == std::string_view::npos ? std::string_view::npos : comma - begin);
    if (part.empty()) return fail(fmt::format("item {} is empty", item));
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    if (ec != std::errc() || end != part.data() + part.size() || v < 0 || v > kMax) {
      return fail(fmt::format("item {} ({}) is not a token id", item, part));
    }
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string_view::npos) break;
    begin = comma + 1;
  }
  return ids;
}

Result<afd::AfdConfig> parse_afd_flags(std::string_view topology, std::string_view connector, int stages,
                                       double timeout_s) {
  const std::optional<afd::TopologyCounts> t = afd::parse_topology_counts(topology);
  if (!t || t->num_attention < 1 || t->num_attention > afd::kMaxAttentionRanks || t->num_ffn < 1 ||
      t->num_ffn > afd::kMaxFfnRanks) {
    return invalid_argument(fmt::format(
        "--afd {}: expected <A>A<F>F with A attention ranks in [1, {}] and F FFN ranks in [1, {}], e.g. 2A1F",
        shown(topology), afd::kMaxAttentionRanks, afd::kMaxFfnRanks));
  }
  if (connector != "sync" && connector != "async") {
    return invalid_argument(fmt::format("--afd-connector {}: expected one of sync | async", shown(connector)));
  }
  afd::AfdConfig cfg;
  cfg.num_attention = t->num_attention;
  cfg.num_ffn = t->num_ffn;
  afd::set_connector(connector == "async" ? afd::ConnectorKind::kAsync : afd::ConnectorKind::kSync, &cfg);
  cfg.num_stages = stages;
  cfg.timeout_ms = static_cast<int64_t>(std::llround(timeout_s * 1000.0));
  return cfg;
}

namespace {

// One integer flag of any width: parsed as int64 with the range check, then stored in `T` (the range fits T).
template <typename T>
CLI::Option* add_integer_flag(CLI::App* app, const std::string& name, T* target, int64_t lo, int64_t hi,
                              std::string help, std::string default_text) {
  if (default_text.empty()) default_text = std::to_string(*target);
  return app
      ->add_option_function<std::string>(
          name,
          [name, target, lo, hi](const std::string& s) {
            auto v = parse_int(name, s, lo, hi);
            if (!v.ok()) throw_usage(v.status());
            *target = static_cast<T>(*v);
          },
          with_default(std::move(help), fmt::format("Integer in [{}, {}]", lo, hi), default_text))
      ->type_name("INT");
}

}  // namespace

CLI::Option* add_int64_flag(CLI::App* app, const std::string& name, int64_t* target, int64_t lo, int64_t hi,
                            std::string help, std::string default_text) {
  return add_integer_flag(app, name, target, lo, hi, std::move(help), std::move(default_text));
}

CLI::Option* add_int_flag(CLI::App* app, const std::string& name, int* target, int lo, int hi, std::string help,
                          std::string default_text) {
  return add_integer_flag(app, name, target, lo, hi, std::move(help), std::move(default_text));
}

CLI::Option* add_uint64_flag(CLI::App* app, const std::string& name, uint64_t* target, std::string help) {
  return app
      ->add_option_function<std::string>(
          name,
          [name, target](const std::string& s) {
            auto v = parse_uint64(name, s);
            if (!v.ok()) throw_usage(v.status());
            *target = *v;
          },
          with_default(std::move(help), fmt::format("Integer in [0, {}]", std::numeric_limits<uint64_t>::max()),
                       std::to_string(*target)))
      ->type_name("UINT");
}

namespace {
template <typename T>
CLI::Option* add_real(CLI::App* app, const std::string& name, T* target, double lo, double hi, bool lo_open,
                      std::string help, std::string_view what) {
  std::string rule = real_rule(lo, hi, lo_open, what);
  rule[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(rule[0])));
  return app
      ->add_option_function<std::string>(
          name,
          [name, target, lo, hi, lo_open, what = std::string(what)](const std::string& s) {
            auto v = parse_real(name, s, lo, hi, lo_open, what);
            if (!v.ok()) throw_usage(v.status());
            *target = static_cast<T>(*v);
          },
          with_default(std::move(help), rule, number_text(static_cast<double>(*target))))
      ->type_name("NUMBER");
}
}  // namespace

CLI::Option* add_real_flag(CLI::App* app, const std::string& name, double* target, double lo, double hi, bool lo_open,
                           std::string help, std::string_view what) {
  return add_real(app, name, target, lo, hi, lo_open, std::move(help), what);
}

CLI::Option* add_float_flag(CLI::App* app, const std::string& name, float* target, const engine::FloatRange& range,
                            std::string help) {
  std::string rule = range.rule();
  rule[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(rule[0])));
  return app
      ->add_option_function<std::string>(
          name,
          [name, target, range](const std::string& s) {
            auto v = parse_float(name, s, range);
            if (!v.ok()) throw_usage(v.status());
            *target = *v;
          },
          with_default(std::move(help), rule, number_text(static_cast<double>(*target))))
      ->type_name("NUMBER");
}

CLI::Option* add_string_list_flag(CLI::App* app, const std::string& name, std::vector<std::string>* target,
                                  std::string help, std::string default_text) {
  if (!default_text.empty()) help += fmt::format("\nDefault: {}", default_text);
  return app
      ->add_option_function<std::vector<std::string>>(
          name,
          [name, target](const std::vector<std::string>& values) {
            for (const std::string& s : values) {
              if (s.empty()) throw_usage(invalid_argument(fmt::format("{} '': the value is empty", name)));
              target->push_back(s);
            }
          },
          help)
      ->type_name("TEXT")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

CLI::Option* add_string_flag(CLI::App* app, const std::string& name, std::string* target, std::string help,
                             std::string default_text) {
  if (!default_text.empty()) help += fmt::format("\nDefault: {}", default_text);
  return app
      ->add_option_function<std::string>(
          name,
          [name, target](const std::string& s) {
            if (s.empty()) throw_usage(invalid_argument(fmt::format("{} '': the value is empty", name)));
            *target = s;
          },
          help)
      ->type_name("TEXT");
}

CLI::Option* add_choice_flag(CLI::App* app, const std::string& name, std::string* target,
                             std::vector<std::string> choices, std::string help) {
  const std::string list = fmt::format("{}", fmt::join(choices, " | "));
  help += fmt::format("\nOne of {}", list);
  if (!target->empty()) help += fmt::format(". Default: {}", *target);
  return app
      ->add_option_function<std::string>(
          name,
          [name, target, choices, list](const std::string& s) {
            for (const auto& c : choices) {
              if (s == c) {
                *target = s;
                return;
              }
            }
            throw_usage(invalid_argument(fmt::format("{} {}: expected one of {}", name, shown(s), list)));
          },
          help)
      ->type_name("TEXT");
}

CLI::Option* add_int_list_flag(CLI::App* app, const std::string& name, std::vector<int32_t>* target, int64_t lo,
                               int64_t hi, std::string help) {
  return app
      ->add_option_function<std::vector<std::string>>(
          name,
          [name, target, lo, hi](const std::vector<std::string>& values) {
            target->clear();
            for (const auto& s : values) {
              auto v = parse_int(name, s, lo, hi);
              if (!v.ok()) throw_usage(v.status());
              target->push_back(static_cast<int32_t>(*v));
            }
          },
          with_default(std::move(help), fmt::format("Integers in [{}, {}]", lo, hi), "none"))
      ->type_name("INT");
}

}  // namespace genbridge::tools
