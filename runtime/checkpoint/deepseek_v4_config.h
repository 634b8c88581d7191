#pragma once
// Internal: the DeepSeek-V4 part of config.json (parse, cross-key rules, writing, the log's description).
// parse_model_config, validate_model_config, to_config_json and describe call these for
// DeepseekV4ForCausalLM. The keys are the ones DeepSeek ships (docs/deepseek.md, "DeepSeek-V4 checkpoints"),
// not Hugging Face's renamed ones.

#include <string>
#include <string_view>

#include "genbridge/core/status.h"
#include "runtime/checkpoint/config.h"
#include "runtime/checkpoint/config_reader.h"

namespace genbridge::model::detail {

// Reads every key of a DeepSeek-V4 config.json (c->architecture is already set) except torch_dtype, the weight
// form included (quantization_config and expert_dtype: DeepseekV4Config::expert_dtype); refuses, naming the key,
// what would change the forward and genbridge does not implement (expert groups, dense layers, Hugging Face's
// renamed keys, FP8 blocks other than 128 x 128 or with scales that are not powers of two).
Status parse_deepseek_v4_config(const ConfigReader& r, ModelConfig* c);
// The rules validate_model_config enforces for a DeepSeek-V4 config.
Status validate_deepseek_v4_config(const ModelConfig& c, std::string_view source);
// config.json text (DeepSeek's keys) of a DeepSeek-V4 config.
std::string deepseek_v4_config_json(const ModelConfig& c, std::string_view torch_dtype);
// describe() of a DeepSeek-V4 config: layer kinds, routing, attention widths, hyper-connections.
std::string describe_deepseek_v4(const ModelConfig& c);

}  // namespace genbridge::model::detail
