#pragma once
// Command-line values: every number is parsed here, base 10 with nothing before or after it, and checked
// against its range; every message names the flag as typed, the value and the rule, e.g.
//   "--threads -1: expected an integer in [0, 255]".
// The add_*_flag helpers register a flag with CLI11 so that a bad value fails the parse with that message
// (a CLI::ValidationError) and the help text states the range and the default.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "afd/config.h"
#include "genbridge/core/status.h"
#include "runtime/engine/sampler.h"

namespace genbridge::tools {

// An integer in [lo, hi].
Result<int64_t> parse_int(std::string_view flag, std::string_view text, int64_t lo, int64_t hi);
// Any unsigned 64-bit integer (no sign).
Result<uint64_t> parse_uint64(std::string_view flag, std::string_view text);
// A finite number in [lo, hi], or (lo, hi] when `lo_open` (hi may be infinity). `what` describes it
// ("a number of seconds").
Result<double> parse_real(std::string_view flag, std::string_view text, double lo, double hi, bool lo_open,
                          std::string_view what = "a number");
// A number the sampler keeps as float, accepted when `range` contains it (checked on the float it becomes:
// engine::FloatRange). The message states range.rule().
Result<float> parse_float(std::string_view flag, std::string_view text, const engine::FloatRange& range);
// Comma-separated token ids, each an integer in [0, 2^31 - 1], at least one, no empty item.
Result<std::vector<int32_t>> parse_token_list(std::string_view flag, std::string_view text);

// The AFD settings the flags give, checked here once: --afd's topology <A>A<F>F with A attention ranks in
// [1, afd::kMaxAttentionRanks] and F FFN ranks in [1, afd::kMaxFfnRanks] (the message names --afd and the
// value as typed), --afd-connector "sync" or "async" with what it implies (afd::set_connector),
// --afd-stages and --afd-timeout (seconds; range-checked when parsed, at least 1 ms). The transport and
// the model-shape keys are the job's to fill.
Result<afd::AfdConfig> parse_afd_flags(std::string_view topology, std::string_view connector, int stages,
                                       double timeout_s);

// Registration. Each returns the option so callers can add ->type_name() etc. `help` is the sentence(s)
// explaining the flag; the helper appends the range and "Default: ...".
CLI::Option* add_int_flag(CLI::App* app, const std::string& name, int* target, int lo, int hi, std::string help,
                          std::string default_text = "");
CLI::Option* add_int64_flag(CLI::App* app, const std::string& name, int64_t* target, int64_t lo, int64_t hi,
                            std::string help, std::string default_text = "");
CLI::Option* add_uint64_flag(CLI::App* app, const std::string& name, uint64_t* target, std::string help);
CLI::Option* add_real_flag(CLI::App* app, const std::string& name, double* target, double lo, double hi, bool lo_open,
                           std::string help, std::string_view what = "a number");
// A float flag of the sampler (parse_float).
CLI::Option* add_float_flag(CLI::App* app, const std::string& name, float* target, const engine::FloatRange& range,
                            std::string help);
// A non-empty string; `default_text` (if any) is shown as the default.
CLI::Option* add_string_flag(CLI::App* app, const std::string& name, std::string* target, std::string help,
                             std::string default_text = "");
// A repeatable string flag: every occurrence appends its values (`--name a --name b` or `--name a b`), each
// non-empty.
CLI::Option* add_string_list_flag(CLI::App* app, const std::string& name, std::vector<std::string>* target,
                                  std::string help, std::string default_text = "");
// One of `choices`.
CLI::Option* add_choice_flag(CLI::App* app, const std::string& name, std::string* target,
                             std::vector<std::string> choices, std::string help);
// Repeatable integer in [lo, hi] (each occurrence may hold several values).
CLI::Option* add_int_list_flag(CLI::App* app, const std::string& name, std::vector<int32_t>* target, int64_t lo,
                               int64_t hi, std::string help);

}  // namespace genbridge::tools
