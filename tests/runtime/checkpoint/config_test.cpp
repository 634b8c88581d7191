// ModelConfig: parsing a real Qwen3-MoE config.json, defaults, the MoE-layer rule and every bad-config rule
// with its exact message.
#include "runtime/checkpoint/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

using json = nlohmann::json;

// The shape of Qwen3-30B-A3B's config.json (as published on the Hugging Face hub).
const char* kQwen3MoeConfig = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "decoder_sparse_step": 1,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 6144,
  "max_position_embeddings": 40960,
  "max_window_layers": 48,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "output_router_logits": false,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "router_aux_loss_coef": 0.001,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

json base() { return json::parse(kQwen3MoeConfig); }

// The error message of parsing `j` (empty when it parses).
std::string error_of(const json& j) {
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

std::string error_with(const std::string& key, const json& value) {
  json j = base();
  j[key] = value;
  return error_of(j);
}

std::string error_without(const std::string& key) {
  json j = base();
  j.erase(key);
  return error_of(j);
}

TEST(ModelConfig, parses_qwen3_30b_a3b_config) {
  Result<ModelConfig> r = parse_model_config(kQwen3MoeConfig, "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_hidden_layers, 48);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 768);
  EXPECT_EQ(c.intermediate_size, 6144);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.decoder_sparse_step, 1);
  EXPECT_TRUE(c.mlp_only_layers.empty());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.shared_expert_intermediate_size, 0);
  EXPECT_FALSE(c.has_shared_expert());
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  EXPECT_EQ(c.norm_type, NormType::kRms);
  EXPECT_EQ(c.q_size(), 4096);
  EXPECT_EQ(c.kv_size(), 512);
  EXPECT_EQ(c.gqa_group(), 8);
  EXPECT_EQ(c.num_moe_layers(), 48);
}

TEST(ModelConfig, optional_keys_take_hf_defaults) {
  json j = base();
  for (const char* k : {"head_dim", "max_position_embeddings", "norm_topk_prob", "decoder_sparse_step",
                        "mlp_only_layers", "tie_word_embeddings", "torch_dtype", "intermediate_size"}) {
    j.erase(k);
  }
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->head_dim, 2048 / 32);  // hidden_size / num_attention_heads
  EXPECT_EQ(r->max_position_embeddings, 32768);
  EXPECT_FALSE(r->norm_topk_prob);
  EXPECT_EQ(r->decoder_sparse_step, 1);
  EXPECT_FALSE(r->tie_word_embeddings);
  EXPECT_EQ(r->torch_dtype, DType::kBF16);
  EXPECT_EQ(r->intermediate_size, 0);  // not needed: every layer is MoE
}

TEST(ModelConfig, null_optional_key_is_absent) {
  json j = base();
  j["head_dim"] = nullptr;
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->head_dim, 64);
}

TEST(ModelConfig, newer_transformers_dtype_key) {
  json j = base();
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->torch_dtype, DType::kF16);
}

TEST(ModelConfig, shared_expert_and_gemma_norm_extension) {
  json j = base();
  j["shared_expert_intermediate_size"] = 5632;
  j["genbridge_norm_type"] = "gemma";
  j["tie_word_embeddings"] = true;
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->has_shared_expert());
  EXPECT_EQ(r->shared_expert_intermediate_size, 5632);
  EXPECT_EQ(r->norm_type, NormType::kGemma);
  EXPECT_TRUE(r->tie_word_embeddings);
}

TEST(ModelConfig, moe_layer_rule_follows_hf) {
  ModelConfig c = parse_model_config(kQwen3MoeConfig, "cfg.json").value();
  c.num_hidden_layers = 6;
  c.decoder_sparse_step = 2;
  c.mlp_only_layers = {3};
  // MoE iff not in mlp_only_layers and (layer + 1) % step == 0: layers 1 and 5 (3 is excluded).
  std::vector<bool> moe;
  for (int64_t l = 0; l < 6; ++l) moe.push_back(c.is_moe_layer(l));
  EXPECT_EQ(moe, (std::vector<bool>{false, true, false, false, false, true}));
  EXPECT_EQ(c.num_moe_layers(), 2);
  c.num_experts = 0;
  for (int64_t l = 0; l < 6; ++l) EXPECT_FALSE(c.is_moe_layer(l)) << l;
}

TEST(ModelConfig, all_dense_model_needs_no_moe_keys) {
  json j = base();
  j["num_experts"] = 0;
  j.erase("num_experts_per_tok");
  j.erase("moe_intermediate_size");
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->num_moe_layers(), 0);
}

TEST(ModelConfig, malformed_json) {
  EXPECT_EQ(parse_model_config("{\"a\": [1, 2", "cfg.json").status().message(),
            "cfg.json: malformed JSON: parse error at line 1, column 12: syntax error while parsing array - "
            "unexpected end of input; expected ']'");
}

TEST(ModelConfig, duplicate_key) {
  std::string text = kQwen3MoeConfig;
  text.insert(1, "\"hidden_size\": 4096,");
  EXPECT_EQ(parse_model_config(text, "cfg.json").status().message(), "cfg.json: duplicate key 'hidden_size'");
}

TEST(ModelConfig, top_level_not_an_object) {
  EXPECT_EQ(parse_model_config("[1, 2]", "cfg.json").status().message(),
            "cfg.json: the top level must be a JSON object, found array");
}

TEST(ModelConfig, missing_architectures) {
  EXPECT_EQ(error_without("architectures"), "cfg.json: missing required key 'architectures'");
}

TEST(ModelConfig, unknown_architecture) {
  EXPECT_EQ(error_with("architectures", {"LlamaForCausalLM"}),
            "cfg.json: architectures = [\"LlamaForCausalLM\"]: unsupported architecture (genbridge supports "
            "[\"Qwen3MoeForCausalLM\", \"Qwen3_5MoeForConditionalGeneration\", \"Qwen3_5MoeForCausalLM\", "
            "\"DeepseekV3ForCausalLM\", \"DeepseekV32ForCausalLM\", "
            "\"DeepseekV4ForCausalLM\"])");
  EXPECT_EQ(error_with("architectures", "Qwen3MoeForCausalLM"),
            "cfg.json: architectures = \"Qwen3MoeForCausalLM\": unsupported architecture (genbridge supports "
            "[\"Qwen3MoeForCausalLM\", \"Qwen3_5MoeForConditionalGeneration\", \"Qwen3_5MoeForCausalLM\", "
            "\"DeepseekV3ForCausalLM\", \"DeepseekV32ForCausalLM\", "
            "\"DeepseekV4ForCausalLM\"])");
}

TEST(ModelConfig, model_type_disagrees_with_architecture) {
  EXPECT_EQ(error_with("model_type", "qwen2_moe"),
            "cfg.json: model_type = \"qwen2_moe\": must be \"qwen3_moe\" for Qwen3MoeForCausalLM");
}

TEST(ModelConfig, unsupported_features_are_refused) {
  EXPECT_EQ(error_with("attention_bias", true),
            "cfg.json: attention_bias = true: must be false (attention projection biases are not supported)");
  EXPECT_EQ(error_with("hidden_act", "gelu"),
            "cfg.json: hidden_act = \"gelu\": must be \"silu\" (experts and dense layers are SwiGLU)");
  EXPECT_EQ(error_with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}}),
            "cfg.json: rope_scaling = {\"factor\":4.0,\"rope_type\":\"yarn\"}: must be null (RoPE scaling is not "
            "supported)");
  EXPECT_EQ(error_with("use_sliding_window", true),
            "cfg.json: use_sliding_window = true: must be false (sliding-window attention is not supported)");
}

TEST(ModelConfig, every_required_key_is_named_when_missing) {
  for (const char* key :
       {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
        "rope_theta", "num_experts", "num_experts_per_tok", "moe_intermediate_size"}) {
    EXPECT_EQ(error_without(key), std::string("cfg.json: missing required key '") + key + "'") << key;
  }
}

TEST(ModelConfig, intermediate_size_required_when_a_layer_is_dense) {
  json j = base();
  j.erase("intermediate_size");
  j["mlp_only_layers"] = {0, 47};
  EXPECT_EQ(error_of(j), "cfg.json: missing required key 'intermediate_size' (layer 0 is dense)");
  j["mlp_only_layers"] = json::array();
  j["decoder_sparse_step"] = 2;
  EXPECT_EQ(error_of(j), "cfg.json: missing required key 'intermediate_size' (layer 0 is dense)");
  j["intermediate_size"] = 0;
  EXPECT_EQ(error_of(j),
            "cfg.json: intermediate_size = 0: must be a positive integer no larger than 16777216 because layer 0 is "
            "dense");
}

TEST(ModelConfig, sizes_must_be_positive_integers) {
  EXPECT_EQ(error_with("hidden_size", 0),
            "cfg.json: hidden_size = 0: must be a positive integer no larger than 16777216");
  EXPECT_EQ(error_with("vocab_size", -5),
            "cfg.json: vocab_size = -5: must be a positive integer no larger than 16777216");
  EXPECT_EQ(error_with("hidden_size", "2048"), "cfg.json: hidden_size = \"2048\": must be an integer");
  EXPECT_EQ(error_with("hidden_size", 2048.5), "cfg.json: hidden_size = 2048.5: must be an integer");
  EXPECT_EQ(error_with("num_hidden_layers", true), "cfg.json: num_hidden_layers = true: must be an integer");
  EXPECT_EQ(error_with("num_hidden_layers", 1 << 25),
            "cfg.json: num_hidden_layers = 33554432: must be a positive integer no larger than 16777216");
  EXPECT_EQ(error_with("moe_intermediate_size", 0),
            "cfg.json: moe_intermediate_size = 0: must be a positive integer no larger than 16777216");
  EXPECT_EQ(error_with("num_experts", -1),
            "cfg.json: num_experts = -1: must be a non-negative integer no larger than 16777216");
  EXPECT_EQ(error_with("max_position_embeddings", 0),
            "cfg.json: max_position_embeddings = 0: must be a positive integer no larger than 2147483648");
}

TEST(ModelConfig, heads_not_multiple_of_kv_heads) {
  EXPECT_EQ(error_with("num_key_value_heads", 5),
            "cfg.json: num_key_value_heads = 5: num_attention_heads (32) must be a multiple of num_key_value_heads");
  EXPECT_EQ(error_with("num_key_value_heads", 64),
            "cfg.json: num_key_value_heads = 64: num_attention_heads (32) must be a multiple of num_key_value_heads");
}

TEST(ModelConfig, head_dim_rules) {
  EXPECT_EQ(error_with("head_dim", 127),
            "cfg.json: head_dim = 127: must be even (NeoX RoPE rotates the two halves of each head)");
  json j = base();
  j.erase("head_dim");
  j["num_attention_heads"] = 48;
  j["num_key_value_heads"] = 4;
  EXPECT_EQ(error_of(j),
            "cfg.json: head_dim is absent and hidden_size (2048) is not a positive multiple of num_attention_heads "
            "(48)");
}

// Only head dimensions attention implements load (32, 96 and 512 used to load and fail at the
// first forward). The message names the key the value came from.
TEST(ModelConfig, head_dim_must_be_one_attention_implements) {
  const std::string rule = "must be 64, 80, 96, 112, 128, 192 or 256 (the head dimensions attention implements)";
  for (int64_t d : {32, 48, 160, 384, 512}) {
    EXPECT_EQ(error_with("head_dim", d), "cfg.json: head_dim = " + std::to_string(d) + ": " + rule);
  }
  for (int64_t d : {64, 80, 96, 112, 128, 192, 256}) EXPECT_EQ(error_with("head_dim", d), "") << d;
  json j = base();
  j.erase("head_dim");
  j["num_attention_heads"] = 64;  // 2048 / 64 = 32
  j["num_key_value_heads"] = 4;
  EXPECT_EQ(error_of(j), "cfg.json: head_dim is absent and hidden_size / num_attention_heads = 2048 / 64 = 32: " + rule);
  j["num_attention_heads"] = 16;  // 2048 / 16 = 128
  EXPECT_EQ(error_of(j), "");
  ModelConfig c = parse_model_config(kQwen3MoeConfig, "cfg.json").value();
  c.head_dim = 96;
  EXPECT_TRUE(validate_model_config(c, "code").ok());
  c.head_dim = 32;
  EXPECT_EQ(validate_model_config(c, "code").message(), "code: head_dim = 32: " + rule);
}

TEST(ModelConfig, topk_rules) {
  EXPECT_EQ(error_with("num_experts_per_tok", 129),
            "cfg.json: num_experts_per_tok = 129: must be between 1 and num_experts (128)");
  EXPECT_EQ(error_with("num_experts_per_tok", 0),
            "cfg.json: num_experts_per_tok = 0: must be between 1 and num_experts (128)");
}

TEST(ModelConfig, float_rules) {
  EXPECT_EQ(error_with("rms_norm_eps", 0), "cfg.json: rms_norm_eps = 0: must be a positive finite number");
  EXPECT_EQ(error_with("rms_norm_eps", -1e-6), "cfg.json: rms_norm_eps = -1e-06: must be a positive finite number");
  EXPECT_EQ(error_with("rope_theta", 0.0), "cfg.json: rope_theta = 0: must be a positive finite number");
  EXPECT_EQ(error_with("rope_theta", "1e6"), "cfg.json: rope_theta = \"1e6\": must be a number");
  EXPECT_EQ(error_with("norm_topk_prob", 1), "cfg.json: norm_topk_prob = 1: must be true or false");
}

// A value the forward pass rounds to fp32 must survive the rounding: beyond 3.4e38 it becomes inf (an
// infinite epsilon makes every RMSNorm return 0), below 1.4e-45 it becomes 0.
TEST(ModelConfig, floats_outside_fp32_are_refused_naming_the_key) {
  const std::string rule = ": must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass uses it in fp32)";
  EXPECT_EQ(error_with("rms_norm_eps", 1e39), "cfg.json: rms_norm_eps = 1e+39" + rule);
  EXPECT_EQ(error_with("rms_norm_eps", 1e-50), "cfg.json: rms_norm_eps = 1e-50" + rule);
  EXPECT_EQ(error_with("rope_theta", 1e300), "cfg.json: rope_theta = 1e+300" + rule);
  EXPECT_TRUE(parse_model_config(kQwen3MoeConfig, "cfg.json").ok());
}

TEST(ModelConfig, sparse_step_and_mlp_only_layers_rules) {
  EXPECT_EQ(error_with("decoder_sparse_step", 0),
            "cfg.json: decoder_sparse_step = 0: must be a positive integer (1: every layer may be MoE)");
  EXPECT_EQ(error_with("mlp_only_layers", {48}),
            "cfg.json: mlp_only_layers = [48]: layer 48 is outside [0, num_hidden_layers = 48)");
  EXPECT_EQ(error_with("mlp_only_layers", {-1}),
            "cfg.json: mlp_only_layers = [-1]: layer -1 is outside [0, num_hidden_layers = 48)");
  EXPECT_EQ(error_with("mlp_only_layers", {1, 1}), "cfg.json: mlp_only_layers = [1, 1]: layer 1 is listed twice");
  EXPECT_EQ(error_with("mlp_only_layers", "0"), "cfg.json: mlp_only_layers = \"0\": must be a list of layer indices");
  EXPECT_EQ(error_with("mlp_only_layers", {0.5}), "cfg.json: mlp_only_layers = [0.5]: must be a list of layer indices");
}

TEST(ModelConfig, shared_expert_needs_experts) {
  json j = base();
  j["num_experts"] = 0;
  j["shared_expert_intermediate_size"] = 64;
  EXPECT_EQ(error_of(j),
            "cfg.json: shared_expert_intermediate_size = 64: a shared expert needs MoE layers (num_experts > 0)");
  EXPECT_EQ(error_with("shared_expert_intermediate_size", -2),
            "cfg.json: shared_expert_intermediate_size = -2: must be a non-negative integer no larger than 16777216");
}

TEST(ModelConfig, dtype_and_norm_type_values) {
  EXPECT_EQ(error_with("torch_dtype", "int8"),
            "cfg.json: torch_dtype = \"int8\": must be \"bfloat16\", \"float16\" or \"float32\"");
  EXPECT_EQ(error_with("genbridge_norm_type", "layer"),
            "cfg.json: genbridge_norm_type = \"layer\": must be \"rms\" or \"gemma\"");
}

TEST(ModelConfig, validate_rejects_bad_struct) {
  ModelConfig c = parse_model_config(kQwen3MoeConfig, "cfg.json").value();
  EXPECT_TRUE(validate_model_config(c, "code").ok());
  c.num_experts_per_tok = 200;
  EXPECT_EQ(validate_model_config(c, "code").message(),
            "code: num_experts_per_tok = 200: must be between 1 and num_experts (128)");
  c.num_experts_per_tok = 8;
  c.torch_dtype = DType::kI8;
  EXPECT_EQ(validate_model_config(c, "code").message(),
            "code: torch_dtype = int8: must be bfloat16, float16 or float32");
}

TEST(ModelConfig, to_config_json_round_trips_every_preset) {
  for (const std::string& name : synthetic_preset_names()) {
    const ModelConfig c = synthetic_preset_config(name).value();
    Result<ModelConfig> back = parse_model_config(to_config_json(c), name);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, c) << name;
  }
  ModelConfig c = parse_model_config(kQwen3MoeConfig, "cfg.json").value();
  c.rms_norm_eps = 1.0 / 3.0;  // not a short decimal: must still round-trip exactly
  c.rope_theta = 123456.789;
  EXPECT_EQ(parse_model_config(to_config_json(c), "x").value(), c);
}

TEST(ModelConfig, load_names_the_file) {
  testing::TempDir dir;
  Result<ModelConfig> missing = load_model_config(dir / "config.json");
  EXPECT_EQ(missing.status().message(),
            (dir / "config.json").string() + ": cannot open the model config (does the file exist?)");
  testing::write_file_bytes(dir / "config.json", "{\"architectures\": [\"Qwen3MoeForCausalLM\"]}");
  EXPECT_EQ(load_model_config(dir / "config.json").status().message(),
            (dir / "config.json").string() + ": missing required key 'vocab_size'");
}

}  // namespace
}  // namespace genbridge::model
