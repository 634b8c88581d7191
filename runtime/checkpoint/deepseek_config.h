#pragma once
// Internal: the DeepSeek-V3 / V3.2 part of config.json (parse, cross-key rules, writing). parse_model_config,
// validate_model_config and to_config_json call these for the DeepSeek architectures.

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

}  // namespace genbridge::model::detail
