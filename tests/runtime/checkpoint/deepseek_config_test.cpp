// DeepSeek-V3 / V3.2 config.json (MLA, DeepSeek routing, YaRN, DSA indexer) and the HF tensor binding:
// real configs parse, every inconsistent key and every missing or mis-shaped tensor is an error naming it.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/config.h"
#include "support/checkpoint_edit.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

using json = nlohmann::json;

// The shape of DeepSeek-V3's config.json as published on the Hugging Face hub (quantization_config left out).
const char* kDeepseekV3Config = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "ep_size": 1,
  "first_k_dense_replace": 3,
  "hidden_act": "silu",
  "hidden_size": 7168,
  "initializer_range": 0.02,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "max_position_embeddings": 163840,
  "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048,
  "moe_layer_freq": 1,
  "n_group": 8,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 61,
  "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000,
  "routed_scaling_factor": 2.5,
  "scoring_func": "sigmoid",
  "seq_aux": true,
  "tie_word_embeddings": false,
  "topk_group": 4,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.33.1",
  "use_cache": true,
  "v_head_dim": 128,
  "vocab_size": 129280
})";

json v3() { return json::parse(kDeepseekV3Config); }
json v32() {
  json j = v3();
  j["architectures"] = {"DeepseekV32ForCausalLM"};
  j["model_type"] = "deepseek_v32";
  j["index_n_heads"] = 64;
  j["index_head_dim"] = 128;
  j["index_topk"] = 2048;
  return j;
}

std::string error_of(const json& j) {
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(DeepseekConfig, parses_deepseek_v3) {
  Result<ModelConfig> r = parse_model_config(kDeepseekV3Config, "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  const DeepseekConfig& d = c.deepseek;
  EXPECT_EQ(c.architecture, Architecture::kDeepseekV3);
  EXPECT_TRUE(c.is_deepseek());
  EXPECT_FALSE(c.has_indexer());
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_EQ(c.intermediate_size, 18432);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.max_position_embeddings, 163840);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(d.q_lora_rank, 1536);
  EXPECT_EQ(d.kv_lora_rank, 512);
  EXPECT_EQ(d.qk_nope_head_dim, 128);
  EXPECT_EQ(d.qk_rope_head_dim, 64);
  EXPECT_EQ(d.v_head_dim, 128);
  EXPECT_EQ(d.qk_head_dim(), 192);
  EXPECT_EQ(c.head_dim, 192);
  EXPECT_EQ(d.n_shared_experts, 1);
  EXPECT_EQ(d.n_group, 8);
  EXPECT_EQ(d.topk_group, 4);
  EXPECT_EQ(d.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.first_k_dense_replace, 3);
  EXPECT_EQ(d.moe_layer_freq, 1);
  EXPECT_EQ(d.num_nextn_predict_layers, 1);
  ASSERT_TRUE(d.yarn);
  EXPECT_EQ(d.rope_scaling.factor, 40.0);
  EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(d.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(d.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(d.rope_scaling.mscale, 1.0);
  EXPECT_EQ(d.rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(d.index_topk, 0);
  // first_k_dense_replace = 3: layers 0-2 dense, 3-60 MoE.
  EXPECT_FALSE(c.is_moe_layer(2));
  EXPECT_TRUE(c.is_moe_layer(3));
  EXPECT_TRUE(c.is_moe_layer(60));
  EXPECT_EQ(c.num_moe_layers(), 58);
}

TEST(DeepseekConfig, parses_deepseek_v32_indexer_keys) {
  Result<ModelConfig> r = parse_model_config(v32().dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->architecture, Architecture::kDeepseekV32);
  EXPECT_TRUE(r->has_indexer());
  EXPECT_EQ(r->deepseek.index_n_heads, 64);
  EXPECT_EQ(r->deepseek.index_head_dim, 128);
  EXPECT_EQ(r->deepseek.index_topk, 2048);
}

TEST(DeepseekConfig, q_lora_rank_absent_or_null_means_q_proj) {
  json j = v3();
  j["q_lora_rank"] = nullptr;
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->deepseek.q_lora_rank, 0);
  j.erase("q_lora_rank");
  r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->deepseek.q_lora_rank, 0);
}

TEST(DeepseekConfig, moe_layer_freq_and_no_rope_scaling) {
  json j = v3();
  j["moe_layer_freq"] = 2;
  j["rope_scaling"] = nullptr;
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->deepseek.yarn);
  EXPECT_FALSE(r->is_moe_layer(3));  // odd
  EXPECT_TRUE(r->is_moe_layer(4));
  EXPECT_FALSE(r->is_moe_layer(2));  // dense-first
}

struct BadCase {
  const char* what;
  std::function<void(json&)> edit;
  const char* message;
};

TEST(DeepseekConfig, every_inconsistent_key_is_an_error_naming_it) {
  const std::vector<BadCase> cases = {
      {"kv_lora_rank missing", [](json& j) { j.erase("kv_lora_rank"); },
       "cfg.json: missing required key 'kv_lora_rank'"},
      {"qk_rope_head_dim missing", [](json& j) { j.erase("qk_rope_head_dim"); },
       "cfg.json: missing required key 'qk_rope_head_dim'"},
      {"n_group missing", [](json& j) { j.erase("n_group"); }, "cfg.json: missing required key 'n_group'"},
      {"norm_topk_prob missing", [](json& j) { j.erase("norm_topk_prob"); },
       "cfg.json: missing required key 'norm_topk_prob'"},
      {"intermediate_size missing", [](json& j) { j.erase("intermediate_size"); },
       "cfg.json: missing required key 'intermediate_size' (first_k_dense_replace = 3)"},
      {"kv_lora_rank 0", [](json& j) { j["kv_lora_rank"] = 0; },
       "cfg.json: kv_lora_rank = 0: must be a positive integer no larger than 16777216"},
      {"odd rope", [](json& j) { j["qk_rope_head_dim"] = 63; },
       "cfg.json: qk_rope_head_dim = 63: must be even (RoPE rotates pairs of dimensions)"},
      {"kv heads", [](json& j) { j["num_key_value_heads"] = 8; },
       "cfg.json: num_key_value_heads = 8: must equal num_attention_heads (128) for DeepseekV3ForCausalLM (MLA "
       "shares one latent per token)"},
      {"n_group not a divisor", [](json& j) { j["n_group"] = 7; },
       "cfg.json: n_group = 7: must be a positive divisor of n_routed_experts (256)"},
      {"groups of one", [](json& j) { j["n_group"] = 256; },
       "cfg.json: n_group = 256: leaves 1 expert per group; a group's score is the sum of its best two experts, so "
       "each group needs at least 2"},
      {"topk_group", [](json& j) { j["topk_group"] = 9; },
       "cfg.json: topk_group = 9: must be between 1 and n_group (8)"},
      {"too many experts per token",
       [](json& j) {
         j["topk_group"] = 1;
         j["num_experts_per_tok"] = 33;
       },
       "cfg.json: num_experts_per_tok = 33: must be at most topk_group * n_routed_experts / n_group = 1 * 32 (the "
       "experts of the chosen groups)"},
      {"routed_scaling_factor", [](json& j) { j["routed_scaling_factor"] = 0; },
       "cfg.json: routed_scaling_factor = 0: must be a positive finite number"},
      {"routed_scaling_factor that overflows", [](json& j) { j["routed_scaling_factor"] = 1e38; },
       "cfg.json: routed_scaling_factor = 1e+38: must be at most 1.8e+19: the scaled expert outputs enter the "
       "residual stream, and the next RMSNorm's fp32 sum of squares overflows once an element reaches 1.8e+19 (the "
       "square root of fp32's maximum), so any expert output of magnitude 1 or more would overflow"},
      {"routed_scaling_factor beyond fp32", [](json& j) { j["routed_scaling_factor"] = 1e300; },
       "cfg.json: routed_scaling_factor = 1e+300: must be at most 1.8e+19: the scaled expert outputs enter the "
       "residual stream, and the next RMSNorm's fp32 sum of squares overflows once an element reaches 1.8e+19 (the "
       "square root of fp32's maximum), so any expert output of magnitude 1 or more would overflow"},
      {"rms_norm_eps beyond fp32", [](json& j) { j["rms_norm_eps"] = 1e39; },
       "cfg.json: rms_norm_eps = 1e+39: must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass "
       "uses it in fp32)"},
      {"rope_theta beyond fp32", [](json& j) { j["rope_theta"] = 1e40; },
       "cfg.json: rope_theta = 1e+40: must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass "
       "uses it in fp32)"},
      {"first_k_dense_replace", [](json& j) { j["first_k_dense_replace"] = 62; },
       "cfg.json: first_k_dense_replace = 62: must be between 0 and num_hidden_layers (61)"},
      {"moe_layer_freq", [](json& j) { j["moe_layer_freq"] = 0; },
       "cfg.json: moe_layer_freq = 0: must be a positive integer (1: every layer from first_k_dense_replace on is "
       "MoE)"},
      {"scoring_func", [](json& j) { j["scoring_func"] = "softmax"; },
       "cfg.json: scoring_func = \"softmax\": must be \"sigmoid\" (DeepSeek-V3 routing scores experts with a "
       "sigmoid)"},
      {"topk_method", [](json& j) { j["topk_method"] = "greedy"; },
       "cfg.json: topk_method = \"greedy\": must be \"noaux_tc\" (group-limited top-k over sigmoid scores plus "
       "e_score_correction_bias)"},
      {"model_type", [](json& j) { j["model_type"] = "deepseek_v2"; },
       "cfg.json: model_type = \"deepseek_v2\": must be \"deepseek_v3\" for DeepseekV3ForCausalLM"},
      {"rope type", [](json& j) { j["rope_scaling"]["type"] = "linear"; },
       "cfg.json: rope_scaling.type = \"linear\": must be \"yarn\" (the only RoPE scaling DeepSeek models use)"},
      {"rope factor", [](json& j) { j["rope_scaling"]["factor"] = 0.5; },
       "cfg.json: rope_scaling.factor = 0.5: must be a finite number >= 1"},
      {"rope original", [](json& j) { j["rope_scaling"].erase("original_max_position_embeddings"); },
       "cfg.json: missing required key 'rope_scaling.original_max_position_embeddings'"},
      {"beta order", [](json& j) { j["rope_scaling"]["beta_fast"] = 1; },
       "cfg.json: rope_scaling.beta_fast = 1: must be finite and larger than beta_slow (1)"},
      {"mscale", [](json& j) { j["rope_scaling"]["mscale"] = 0.707; },
       "cfg.json: rope_scaling.mscale = 0.707: must equal mscale_all_dim (1): genbridge applies YaRN's attention "
       "scaling once, as the softmax-scale correction, and does not scale RoPE's cos/sin"},
      {"indexer key on V3", [](json& j) { j["index_topk"] = 64; },
       "cfg.json: index_topk = 64: only DeepseekV32ForCausalLM has the lightning indexer (this config is "
       "DeepseekV3ForCausalLM)"},
      {"rope_interleave", [](json& j) { j["rope_interleave"] = false; },
       "cfg.json: rope_interleave = false: must be true (MLA's RoPE is the interleaved complex-pair form)"},
      {"norm type", [](json& j) { j["genbridge_norm_type"] = "gemma"; },
       "cfg.json: genbridge_norm_type = \"gemma\": must be \"rms\" for DeepseekV3ForCausalLM (its norms are "
       "RMSNorm)"},
  };
  for (const BadCase& c : cases) {
    json j = v3();
    c.edit(j);
    EXPECT_EQ(error_of(j), c.message) << c.what;
  }
  const std::vector<BadCase> v32_cases = {
      {"index_topk missing", [](json& j) { j.erase("index_topk"); }, "cfg.json: missing required key 'index_topk'"},
      {"index_head_dim below rope", [](json& j) { j["index_head_dim"] = 32; },
       "cfg.json: index_head_dim = 32: must be at least qk_rope_head_dim (64): RoPE rotates the indexer head's first "
       "qk_rope_head_dim dimensions"},
      {"index_n_heads 0", [](json& j) { j["index_n_heads"] = 0; },
       "cfg.json: index_n_heads = 0: must be a positive integer no larger than 16777216"},
      {"no q latent", [](json& j) { j["q_lora_rank"] = nullptr; },
       "cfg.json: q_lora_rank = 0: must be positive for DeepseekV32ForCausalLM (the indexer's queries come from the "
       "q latent)"},
      {"model_type", [](json& j) { j["model_type"] = "deepseek_v3"; },
       "cfg.json: model_type = \"deepseek_v3\": must be \"deepseek_v32\" for DeepseekV32ForCausalLM"},
  };
  for (const BadCase& c : v32_cases) {
    json j = v32();
    c.edit(j);
    EXPECT_EQ(error_of(j), c.message) << c.what;
  }
}

TEST(DeepseekConfig, presets_round_trip_through_config_json) {
  for (const char* preset : {"tiny-dsa", "tiny-dsv3", "tiny-dsv3-noq", "small-dsa"}) {
    Result<ModelConfig> c = synthetic_preset_config(preset);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    ASSERT_TRUE(validate_model_config(*c, preset).ok()) << validate_model_config(*c, preset).to_string();
    Result<ModelConfig> back = parse_model_config(to_config_json(*c), preset);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(*back, *c) << preset;
  }
  const ModelConfig dsa = synthetic_preset_config("tiny-dsa").value();
  EXPECT_TRUE(dsa.has_indexer());
  EXPECT_EQ(dsa.deepseek.index_topk, 64);
  EXPECT_FALSE(dsa.is_moe_layer(0));
  EXPECT_TRUE(dsa.is_moe_layer(1));
  EXPECT_EQ(synthetic_preset_config("tiny-dsv3-noq").value().deepseek.q_lora_rank, 0);
  // small-dsa weighs ~0.42 GB in bf16 (its header comment says so).
  EXPECT_NEAR(static_cast<double>(model_weight_bytes(synthetic_preset_config("small-dsa").value())) / 1e9, 0.42, 0.03);
}

// ---- tensors ----

class DeepseekCheckpoint : public ::testing::Test {
 protected:
  std::filesystem::path write(const std::string& preset, DType dtype = DType::kBF16) {
    const std::filesystem::path d = dir_.path() / preset;
    EXPECT_TRUE(write_synthetic_checkpoint(synthetic_preset_config(preset).value(), 3, d, 1, dtype).ok());
    return d;
  }
  std::string open_error(const std::filesystem::path& d) {
    Result<Checkpoint> r = Checkpoint::open(d);
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.status().message();
  }
  testing::TempDir dir_;
};

TEST_F(DeepseekCheckpoint, binds_mla_indexer_and_deepseek_moe) {
  const std::filesystem::path d = write("tiny-dsa");
  Result<Checkpoint> r = Checkpoint::open(d);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelWeights& w = r->weights();
  ASSERT_EQ(w.layers.size(), 3u);
  const LayerWeights& l1 = w.layers[1];
  EXPECT_EQ(l1.mla.q_a_proj.shape_string(), "[96, 128]");
  EXPECT_EQ(l1.mla.q_b_proj.shape_string(), "[512, 96]");  // 4 heads * (64 + 64)
  EXPECT_EQ(l1.mla.q_proj.data(), nullptr);
  EXPECT_EQ(l1.mla.kv_a_proj_with_mqa.shape_string(), "[192, 128]");
  EXPECT_EQ(l1.mla.kv_b_proj.shape_string(), "[512, 128]");  // 4 heads * (64 + 64)
  EXPECT_EQ(l1.mla.o_proj.shape_string(), "[128, 256]");
  EXPECT_EQ(l1.indexer.wq_b.shape_string(), "[512, 96]");
  EXPECT_EQ(l1.indexer.wk.shape_string(), "[128, 128]");
  EXPECT_EQ(l1.indexer.k_norm_bias.shape_string(), "[128]");
  EXPECT_EQ(l1.indexer.weights_proj.shape_string(), "[4, 128]");
  EXPECT_TRUE(l1.is_moe);
  EXPECT_EQ(l1.moe.experts.size(), 16u);
  EXPECT_EQ(l1.moe.e_score_correction_bias.shape_string(), "[16]");
  EXPECT_EQ(l1.moe.shared_expert.gate_proj.shape_string(), "[64, 128]");
  EXPECT_EQ(l1.moe.shared_expert_gate.data(), nullptr);
  EXPECT_FALSE(w.layers[0].is_moe);
  EXPECT_EQ(w.layers[0].dense.gate_proj.shape_string(), "[256, 128]");
  const std::filesystem::path noq = write("tiny-dsv3-noq");
  Result<Checkpoint> r2 = Checkpoint::open(noq);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(r2->weights().layers[0].mla.q_proj.shape_string(), "[512, 128]");
  EXPECT_EQ(r2->weights().layers[0].indexer.wk.data(), nullptr);
  EXPECT_EQ(r2->weights().layers[0].moe.shared_expert.gate_proj.data(), nullptr);
}

TEST_F(DeepseekCheckpoint, correction_bias_keeps_its_file_dtype) {
  // An fp32 checkpoint opened for bf16 weights: everything becomes bf16 except the selection bias.
  const std::filesystem::path d = write("tiny-dsv3", DType::kF32);
  Result<Checkpoint> r = Checkpoint::open(d);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->weights().layers[1].moe.e_score_correction_bias.dtype(), DType::kF32);
  EXPECT_EQ(r->weights().layers[1].moe.router.dtype(), DType::kBF16);
}

TEST_F(DeepseekCheckpoint, missing_tensor_names_it) {
  const std::filesystem::path d = write("tiny-dsa");
  testing::rewrite(d, [](std::vector<testing::RawTensor>& t) {
    std::erase_if(
        t, [](const testing::RawTensor& x) { return x.spec.name == "model.layers.2.self_attn.indexer.wk.weight"; });
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'model.layers.2.self_attn.indexer.wk.weight' is missing (config.json requires "
                               "it: DeepseekV32ForCausalLM has the lightning indexer)");
  const std::filesystem::path d2 = write("tiny-dsv3");
  testing::rewrite(d2, [](std::vector<testing::RawTensor>& t) {
    std::erase_if(t, [](const testing::RawTensor& x) {
      return x.spec.name == "model.layers.1.mlp.gate.e_score_correction_bias";
    });
  });
  EXPECT_EQ(open_error(d2), (d2 / "model.safetensors").string() +
                                ": tensor 'model.layers.1.mlp.gate.e_score_correction_bias' is missing (config.json "
                                "requires it: scoring_func sigmoid with topk_method noaux_tc)");
}

TEST_F(DeepseekCheckpoint, mis_shaped_tensor_names_it_and_the_rule) {
  const std::filesystem::path d = write("tiny-dsa");
  testing::rewrite(d, [](std::vector<testing::RawTensor>& t) {
    for (testing::RawTensor& x : t) {
      if (x.spec.name == "model.layers.0.self_attn.kv_b_proj.weight") x.spec.shape = {128, 512};
    }
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'model.layers.0.self_attn.kv_b_proj.weight' has shape [128, 512] but "
                               "config.json requires [512, 128] = [num_attention_heads * (qk_nope_head_dim + "
                               "v_head_dim), kv_lora_rank]");
}

TEST_F(DeepseekCheckpoint, index_head_dim_not_matching_the_weights_is_an_error) {
  const std::filesystem::path d = write("tiny-dsa");
  ModelConfig c = synthetic_preset_config("tiny-dsa").value();
  c.deepseek.index_head_dim = 64;
  std::ofstream(d / "config.json") << to_config_json(c);
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'model.layers.0.self_attn.indexer.wq_b.weight' has shape [512, 96] but "
                               "config.json requires [256, 96] = [index_n_heads * index_head_dim, q_lora_rank]");
}

TEST_F(DeepseekCheckpoint, multi_token_prediction_layers_are_ignored_only_when_declared) {
  const std::filesystem::path d = write("tiny-dsv3");
  testing::rewrite(d, [](std::vector<testing::RawTensor>& t) {
    testing::RawTensor extra = t.front();
    extra.spec.name = "model.layers.3.eh_proj.weight";
    t.push_back(extra);
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'model.layers.3.eh_proj.weight' is not used by the model config.json "
                               "describes (1 unused tensor; config and weights disagree)");
  ModelConfig c = synthetic_preset_config("tiny-dsv3").value();
  c.deepseek.num_nextn_predict_layers = 1;
  std::ofstream(d / "config.json") << to_config_json(c);
  EXPECT_EQ(open_error(d), "");
}

}  // namespace
}  // namespace genbridge::model
