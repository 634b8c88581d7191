#pragma once
// A checkpoint's generation_config.json as `genbridge serve` reads it (vLLM's `--generation-config auto`):
// every eos_token_id (one or a list) ends a generation, and temperature, top_p, top_k, min_p,
// repetition_penalty and max_new_tokens are the defaults of a request that leaves them out
// (--override-generation-config goes over them). docs/serving.md, "The checkpoint's settings".

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "genbridge/core/status.h"
#include "tools/serve/openai.h"

namespace genbridge::serve {

inline constexpr const char* kGenerationConfigFile = "generation_config.json";

struct GenerationConfig {
  std::vector<int32_t> eos_token_ids;
  SamplingDefaults defaults;
  std::string source;  // the file read; empty: there was none
};

// `dir`'s generation_config.json (none: an empty config). InvalidArgument naming the file, the key, the value
// and the rule.
Result<GenerationConfig> read_generation_config(const std::filesystem::path& dir);
// Parses generation_config.json text; `source` names it in errors.
Result<GenerationConfig> parse_generation_config(std::string_view json_text, std::string_view source);
// `json_text` (a JSON object, --override-generation-config) over `defaults`: the same keys and rules;
// InvalidArgument naming `flag`, the key and the rule.
Status override_generation_config(std::string_view json_text, std::string_view flag, SamplingDefaults* defaults);
// One line for the start-up log: "generation_config.json: eos ids [..]; defaults temperature 0.6, ...".
std::string describe_generation_config(const GenerationConfig& c);

}  // namespace genbridge::serve
