#pragma once
// Internal: the DeepSeek-V3 / V3.2 part of config.json (parse, cross-key rules, writing). parse_model_config,
// validate_model_config and to_config_json call these for the DeepSeek architectures; the rope-scaling and
// routed-scaling rules are shared with DeepSeek-V4.

#include <string>
#include <string_view>

#include "genbridge/core/status.h"
#include "runtime/checkpoint/config.h"
#include "runtime/checkpoint/config_reader.h"

namespace genbridge::model::detail {

// Reads every key of a DeepSeek config.json (c->architecture is already set) except torch_dtype.
Status parse_deepseek_config(const ConfigReader& r, ModelConfig* c);
// The rules validate_model_config enforces for a DeepSeek config.
Status validate_deepseek_config(const ModelConfig& c, std::string_view source);
// config.json text (HF keys) of a DeepSeek config.
std::string deepseek_config_json(const ModelConfig& c, std::string_view torch_dtype);

// Shared with DeepSeek-V4 (deepseek_v4_config.cpp):
// rope_scaling: absent or null leaves *s and *yarn as they are; a {"type" | "rope_type": "yarn", ...} object
// fills *s and sets *yarn. Any other type is an error naming rope_scaling.type.
Status parse_yarn_rope_scaling(const ConfigReader& r, YarnRopeScaling* s, bool* yarn);
// factor >= 1, original_max_position_embeddings in [1, 2^31], beta_fast > beta_slow > 0, mscale and
// mscale_all_dim non-negative; each finite.
Status check_yarn_rope_scaling(const YarnRopeScaling& s, std::string_view source);
// Positive, finite and at most 1.8e19 (docs/deepseek.md: beyond it an expert output of magnitude 1 overflows
// the next RMSNorm's fp32 sum of squares).
Status check_routed_scaling_factor(double v, std::string_view source);

}  // namespace genbridge::model::detail
