#pragma once
// Internal: the Qwen3.5-MoE part of config.json (parse, cross-key rules, writing). parse_model_config,
// validate_model_config and to_config_json call these for the Qwen3.5 architectures.

#include <string>
#include <string_view>

#include "genbridge/core/status.h"
#include "runtime/checkpoint/config.h"
#include "runtime/checkpoint/config_reader.h"

namespace genbridge::model::detail {

// Reads every key of a Qwen3.5-MoE config.json (c->architecture is already set; the keys from text_config
// when the config nests them) except torch_dtype.
Status parse_qwen35_config(const ConfigReader& top, ModelConfig* c);
// The rules validate_model_config enforces for a Qwen3.5 config beyond the shared GQA / MoE ones.
Status validate_qwen35_config(const ModelConfig& c, std::string_view source);
// config.json text (HF keys; text_config nested when c.qwen35.text_config) of a Qwen3.5 config.
std::string qwen35_config_json(const ModelConfig& c, std::string_view torch_dtype);
// The tensors a Qwen3.5 checkpoint ships that text serving does not use: the vision tower (model.visual.*)
// and the multi-token-prediction head (mtp.*).
bool is_ignored_qwen35_tensor(const ModelConfig& c, std::string_view name);

}  // namespace genbridge::model::detail
