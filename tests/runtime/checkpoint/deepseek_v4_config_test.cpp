// DeepSeek-V4 config.json (DeepSeek's own keys) and the tensor binding with DeepSeek's names: the published
// V4-Flash config parses in its FP8 + MXFP4 form and in the bf16 form, every inconsistent key is an
// error naming it, and every missing, mis-shaped or mis-typed tensor is an error naming the file, the tensor
// and the rule.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
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

// DeepSeek-V4-Flash's config.json as DeepSeek publishes it (deepseek-ai/DeepSeek-V4-Flash on the Hugging Face
// hub), as quoted verbatim by a public audit that fetched it; with its final newline it is 1749 bytes, the size
// the audit reports. The FP8 + MXFP4 form: quantization_config and expert_dtype "fp4".
const char* kDeepseekV4FlashConfig = R"({
  "architectures": [
    "DeepseekV4ForCausalLM"
  ],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "eos_token_id": 1,
  "expert_dtype": "fp4",
  "hc_eps": 1e-06,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "head_dim": 512,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "index_head_dim": 128,
  "index_n_heads": 64,
  "index_topk": 512,
  "initializer_range": 0.02,
  "max_position_embeddings": 1048576,
  "model_type": "deepseek_v4",
  "moe_intermediate_size": 2048,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 6,
  "num_hidden_layers": 43,
  "num_hash_layers": 3,
  "num_key_value_heads": 1,
  "num_nextn_predict_layers": 1,
  "o_groups": 8,
  "o_lora_rank": 1024,
  "q_lora_rank": 1024,
  "qk_rope_head_dim": 64,
  "quantization_config": {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "scale_fmt": "ue8m0",
    "weight_block_size": [
      128,
      128
    ]
  },
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32,
    "beta_slow": 1,
    "factor": 16,
    "original_max_position_embeddings": 65536,
    "type": "yarn"
  },
  "rope_theta": 10000,
  "routed_scaling_factor": 1.5,
  "scoring_func": "sqrtsoftplus",
  "sliding_window": 128,
  "swiglu_limit": 10.0,
  "tie_word_embeddings": false,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.57.1",
  "use_cache": true,
  "vocab_size": 129280,
  "compress_rope_theta": 160000,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0]
})";

// The same model in the bf16 form genbridge loads: no quantization_config, no expert_dtype.
json flash_bf16() {
  json j = json::parse(kDeepseekV4FlashConfig);
  j.erase("quantization_config");
  j.erase("expert_dtype");
  return j;
}

std::string error_of(const json& j) {
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

// The published config parses as the FP8 + MXFP4 form: FP8 linears, MXFP4 routed experts; the rest of the model
// is the same as in the bf16 form, and without expert_dtype the routed experts are FP8 (DeepSeek's reference).
TEST(DeepseekV4Config, published_flash_config_parses_in_its_fp8_mxfp4_form) {
  Result<ModelConfig> r = parse_model_config(kDeepseekV4FlashConfig, "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->dsv4.expert_dtype, V4ExpertDtype::kFp4);
  EXPECT_TRUE(r->dsv4.quantized());
  ModelConfig bf16 = parse_model_config(flash_bf16().dump(), "cfg.json").value();
  EXPECT_EQ(bf16.dsv4.expert_dtype, V4ExpertDtype::kBf16);
  EXPECT_FALSE(bf16.dsv4.quantized());
  bf16.dsv4.expert_dtype = V4ExpertDtype::kFp4;
  EXPECT_EQ(*r, bf16);
  EXPECT_TRUE(describe(*r).ends_with("vocab 129280; FP8 linears, MXFP4 routed experts (dequantized to bf16 at load)"))
      << describe(*r);
  json j = json::parse(kDeepseekV4FlashConfig);
  j.erase("expert_dtype");
  EXPECT_EQ(parse_model_config(j.dump(), "cfg.json").value().dsv4.expert_dtype, V4ExpertDtype::kFp8);
  j["expert_dtype"] = "fp8";  // Flash-Base's experts
  EXPECT_EQ(parse_model_config(j.dump(), "cfg.json").value().dsv4.expert_dtype, V4ExpertDtype::kFp8);
  j["expert_dtype"] = "bf16";
  j.erase("quantization_config");
  EXPECT_EQ(parse_model_config(j.dump(), "cfg.json").value().dsv4.expert_dtype, V4ExpertDtype::kBf16);
}

TEST(DeepseekV4Config, published_flash_config_in_bf16_form_parses) {
  Result<ModelConfig> r = parse_model_config(flash_bf16().dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ModelConfig& c = *r;
  const DeepseekV4Config& d = c.dsv4;
  EXPECT_EQ(c.architecture, Architecture::kDeepseekV4);
  EXPECT_TRUE(c.is_deepseek_v4());
  EXPECT_FALSE(c.is_deepseek());
  EXPECT_FALSE(c.has_indexer());  // the V3.2 DSA indexer; V4's is per layer (attention_kind)
  EXPECT_EQ(architecture_name(c.architecture), "DeepseekV4ForCausalLM");
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_hidden_layers, 43);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rotary_dim(), 64);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_EQ(c.moe_intermediate_size, 2048);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.torch_dtype, DType::kBF16);
  EXPECT_EQ(d.q_lora_rank, 1024);
  EXPECT_EQ(d.qk_rope_head_dim, 64);
  EXPECT_EQ(d.o_groups, 8);
  EXPECT_EQ(d.o_lora_rank, 1024);
  EXPECT_EQ(d.sliding_window, 128);
  EXPECT_EQ(d.compress_rope_theta, 160000.0);
  ASSERT_TRUE(d.yarn);
  EXPECT_EQ(d.rope_scaling.factor, 16.0);
  EXPECT_EQ(d.rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_EQ(d.rope_scaling.beta_fast, 32.0);
  EXPECT_EQ(d.rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(d.index_n_heads, 64);
  EXPECT_EQ(d.index_head_dim, 128);
  EXPECT_EQ(d.index_topk, 512);
  EXPECT_EQ(d.n_shared_experts, 1);
  EXPECT_EQ(d.routed_scaling_factor, 1.5);
  EXPECT_EQ(d.num_hash_layers, 3);
  EXPECT_EQ(d.swiglu_limit, 10.0);
  EXPECT_EQ(d.hc_mult, 4);
  EXPECT_EQ(d.hc_sinkhorn_iters, 20);
  EXPECT_EQ(d.hc_eps, 1e-6);
  EXPECT_EQ(d.num_nextn_predict_layers, 1);
  // 44 ratios: the 43 layers' and the MTP layer's (kept as read).
  ASSERT_EQ(d.compress_ratios.size(), 44u);
  EXPECT_EQ(d.compress_ratios.back(), 0);
  int64_t window = 0, sparse = 0, heavy = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_TRUE(c.is_moe_layer(l)) << l;
    const V4AttentionKind k = d.attention_kind(l);
    window += k == V4AttentionKind::kSlidingWindow;
    sparse += k == V4AttentionKind::kCompressedSparse;
    heavy += k == V4AttentionKind::kHeavilyCompressed;
  }
  EXPECT_EQ(window, 2);  // layers 0 and 1
  EXPECT_EQ(sparse, 21);
  EXPECT_EQ(heavy, 20);
  EXPECT_EQ(d.attention_kind(2), V4AttentionKind::kCompressedSparse);
  EXPECT_EQ(d.attention_kind(42), V4AttentionKind::kCompressedSparse);
  EXPECT_EQ(d.attention_kind(41), V4AttentionKind::kHeavilyCompressed);
  EXPECT_EQ(c.num_moe_layers(), 43);
  EXPECT_EQ(c.num_kv_layers(), 43);
  EXPECT_EQ(describe(c),
            "DeepseekV4ForCausalLM 43 layers (2 sliding-window, 21 compressed-sparse /4 (indexer 64 x 128 top-512), 20 "
            "heavily-compressed /128; window 128; all MoE: 256 experts, top-6 + 1 shared, sqrt-softplus, 3 "
            "hash-routed), hidden 4096, 64 heads x 512 (rope 64) over 1 shared KV head, q_lora_rank 1024, output 8 "
            "groups x 1024, 4 hyper-connection streams, YaRN x16 on the compressed layers, vocab 129280");
}

TEST(DeepseekV4Config, optional_keys_take_deepseeks_defaults) {
  json j = flash_bf16();
  for (const char* key : {"num_key_value_heads", "norm_topk_prob", "num_hash_layers", "swiglu_limit",
                          "num_nextn_predict_layers", "rope_scaling", "scoring_func", "topk_method", "model_type"}) {
    j.erase(key);
  }
  Result<ModelConfig> r = parse_model_config(j.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->num_key_value_heads, 1);
  EXPECT_TRUE(r->norm_topk_prob);  // DeepSeek's reference always renormalises
  EXPECT_EQ(r->dsv4.num_hash_layers, 0);
  EXPECT_EQ(r->dsv4.swiglu_limit, 0.0);
  EXPECT_FALSE(r->dsv4.yarn);
  // Without a compressed-sparse layer the indexer keys are not needed; without a compressed layer, neither is
  // compress_rope_theta.
  json swa = flash_bf16();
  swa["num_hidden_layers"] = 2;
  swa["num_hash_layers"] = 1;
  swa.erase("index_topk");
  swa.erase("index_n_heads");
  swa.erase("index_head_dim");
  swa.erase("compress_rope_theta");
  r = parse_model_config(swa.dump(), "cfg.json");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->dsv4.index_topk, 0);
  EXPECT_EQ(r->dsv4.compress_rope_theta, 0.0);
  EXPECT_EQ(r->dsv4.attention_kind(1), V4AttentionKind::kSlidingWindow);
}

struct BadCase {
  const char* what;
  std::function<void(json&)> edit;
  const char* message;
};

TEST(DeepseekV4Config, every_inconsistent_key_is_an_error_naming_it) {
  const std::vector<BadCase> cases = {
      // Required keys.
      {"compress_ratios missing", [](json& j) { j.erase("compress_ratios"); },
       "cfg.json: missing required key 'compress_ratios'"},
      {"hc_mult missing", [](json& j) { j.erase("hc_mult"); }, "cfg.json: missing required key 'hc_mult'"},
      {"o_groups missing", [](json& j) { j.erase("o_groups"); }, "cfg.json: missing required key 'o_groups'"},
      {"head_dim missing", [](json& j) { j.erase("head_dim"); }, "cfg.json: missing required key 'head_dim'"},
      {"index_topk missing", [](json& j) { j.erase("index_topk"); },
       "cfg.json: missing required key 'index_topk' (compress_ratios[2] = 4)"},
      {"compress_rope_theta missing", [](json& j) { j.erase("compress_rope_theta"); },
       "cfg.json: missing required key 'compress_rope_theta' (compress_ratios[2] = 4)"},
      // What genbridge does not implement.
      {"model_type", [](json& j) { j["model_type"] = "deepseek_v3"; },
       "cfg.json: model_type = \"deepseek_v3\": must be \"deepseek_v4\" for DeepseekV4ForCausalLM"},
      // The weight form.
      {"expert_dtype fp8 without quantization_config", [](json& j) { j["expert_dtype"] = "fp8"; },
       "cfg.json: expert_dtype = \"fp8\": describes the routed experts of DeepSeek's FP8 form, which needs a "
       "quantization_config (the FP8 linears' format); without one the checkpoint is the bf16 form (expert_dtype "
       "absent or \"bf16\")"},
      {"expert_dtype fp16", [](json& j) { j["expert_dtype"] = "fp16"; },
       "cfg.json: expert_dtype = \"fp16\": must be \"fp4\" (MXFP4 routed experts) or \"fp8\" (FP8 block experts) "
       "with quantization_config, or absent or \"bf16\" without it"},
      {"expert_dtype bf16 with quantization_config",
       [](json& j) {
         j["quantization_config"] = json::parse(kDeepseekV4FlashConfig)["quantization_config"];
         j["expert_dtype"] = "bf16";
       },
       "cfg.json: expert_dtype = \"bf16\": must be \"fp4\" or \"fp8\" (or absent: FP8) with quantization_config: "
       "DeepSeek's FP8 form quantizes the routed experts too"},
      {"FP8 blocks of 64",
       [](json& j) {
         j = json::parse(kDeepseekV4FlashConfig);
         j["quantization_config"]["weight_block_size"] = {64, 64};
       },
       "cfg.json: quantization_config.weight_block_size = [64,64]: must be [128, 128]: DeepSeek-V4's FP8 linears "
       "have one scale per 128 x 128 block"},
      {"scales not powers of two",
       [](json& j) {
         j = json::parse(kDeepseekV4FlashConfig);
         j["quantization_config"].erase("scale_fmt");
       },
       "cfg.json: quantization_config.scale_fmt is missing but must be \"ue8m0\": DeepSeek-V4's FP8 scales are "
       "powers of two, which is what makes genbridge's bf16 dequantization exact"},
      {"e5m2 codes",
       [](json& j) {
         j = json::parse(kDeepseekV4FlashConfig);
         j["quantization_config"]["fmt"] = "e5m2";
       },
       "cfg.json: quantization_config.fmt is \"e5m2\" but genbridge reads only \"e4m3\" (F8_E4M3 codes)"},
      {"MXFP4 experts of K = 2040",
       [](json& j) {
         j = json::parse(kDeepseekV4FlashConfig);
         j["moe_intermediate_size"] = 2040;
       },
       "cfg.json: moe_intermediate_size = 2040: must be a multiple of 32 with expert_dtype \"fp4\": an MXFP4 routed "
       "expert has one E8M0 scale per 32 inputs"},
      {"HF's layer_types", [](json& j) { j["layer_types"] = {"sliding_attention"}; },
       "cfg.json: layer_types = [\"sliding_attention\"]: is Hugging Face's renamed form of the DeepSeek-V4 config; "
       "genbridge reads the config.json DeepSeek ships (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_theta "
       "and rope_scaling)"},
      {"scoring_func", [](json& j) { j["scoring_func"] = "sigmoid"; },
       "cfg.json: scoring_func = \"sigmoid\": must be \"sqrtsoftplus\" (DeepSeek-V4 scores experts with "
       "sqrt(softplus(logit)))"},
      {"topk_method", [](json& j) { j["topk_method"] = "greedy"; },
       "cfg.json: topk_method = \"greedy\": must be \"noaux_tc\" (top-k over the scores plus the selection-only bias "
       "ffn.gate.bias)"},
      {"expert groups", [](json& j) { j["n_group"] = 8; },
       "cfg.json: n_group = 8: must be 1: DeepSeek-V4 routes over all experts, without expert groups"},
      {"dense layers", [](json& j) { j["first_k_dense_replace"] = 3; },
       "cfg.json: first_k_dense_replace = 3: must be 0: every DeepSeek-V4 layer is MoE"},
      {"attention bias", [](json& j) { j["attention_bias"] = true; },
       "cfg.json: attention_bias = true: must be false (attention projection biases are not supported)"},
      {"norm type", [](json& j) { j["genbridge_norm_type"] = "gemma"; },
       "cfg.json: genbridge_norm_type = \"gemma\": must be \"rms\" for DeepseekV4ForCausalLM (its norms are "
       "RMSNorm)"},
      {"rope scaling type", [](json& j) { j["rope_scaling"]["type"] = "linear"; },
       "cfg.json: rope_scaling.type = \"linear\": must be \"yarn\" (the only RoPE scaling DeepSeek models use)"},
      // Widths.
      {"two kv heads", [](json& j) { j["num_key_value_heads"] = 2; },
       "cfg.json: num_key_value_heads = 2: must be 1 for DeepseekV4ForCausalLM (one key = value head shared by every "
       "query head)"},
      {"odd rope", [](json& j) { j["qk_rope_head_dim"] = 63; },
       "cfg.json: qk_rope_head_dim = 63: must be even, positive and smaller than head_dim (512): RoPE rotates pairs "
       "of each head's trailing qk_rope_head_dim dims"},
      {"rope as wide as the head", [](json& j) { j["qk_rope_head_dim"] = 512; },
       "cfg.json: qk_rope_head_dim = 512: must be even, positive and smaller than head_dim (512): RoPE rotates pairs "
       "of each head's trailing qk_rope_head_dim dims"},
      {"o_groups not a divisor", [](json& j) { j["o_groups"] = 7; },
       "cfg.json: o_groups = 7: must be a positive divisor of num_attention_heads (64): the output projection takes "
       "the heads in o_groups equal groups"},
      {"o_lora_rank 0", [](json& j) { j["o_lora_rank"] = 0; },
       "cfg.json: o_lora_rank = 0: must be a positive integer no larger than 16777216"},
      {"q_lora_rank not an integer", [](json& j) { j["q_lora_rank"] = 1024.5; },
       "cfg.json: q_lora_rank = 1024.5: must be an integer"},
      {"sliding_window 0", [](json& j) { j["sliding_window"] = 0; },
       "cfg.json: sliding_window = 0: must be a positive integer no larger than 16777216"},
      // The layer schedule.
      {"ratios too short",
       [](json& j) {
         j["compress_ratios"] = {0, 0, 4};
       },
       "cfg.json: compress_ratios = a list of 3: must have an entry for each of the num_hidden_layers (43) layers "
       "(entries after them belong to the multi-token-prediction layers)"},
      {"ratio 8", [](json& j) { j["compress_ratios"][5] = 8; },
       "cfg.json: compress_ratios[5] = 8: a layer's ratio must be 0 (sliding window only), 4 (compressed sparse "
       "attention with the lightning indexer) or 128 (heavily compressed attention)"},
      {"negative MTP ratio", [](json& j) { j["compress_ratios"][43] = -1; },
       "cfg.json: compress_ratios[43] = -1: must be a non-negative integer (a multi-token-prediction layer's ratio, "
       "kept as read)"},
      {"ratios not integers", [](json& j) { j["compress_ratios"] = "4"; },
       "cfg.json: compress_ratios = \"4\": must be a list of integers, one per layer"},
      {"compress_rope_theta 0", [](json& j) { j["compress_rope_theta"] = 0; },
       "cfg.json: compress_rope_theta = 0: must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass "
       "uses it in fp32)"},
      {"rope_theta beyond fp32", [](json& j) { j["rope_theta"] = 1e40; },
       "cfg.json: rope_theta = 1e+40: must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass uses "
       "it in fp32)"},
      {"yarn factor", [](json& j) { j["rope_scaling"]["factor"] = 0.5; },
       "cfg.json: rope_scaling.factor = 0.5: must be a finite number >= 1"},
      {"yarn betas", [](json& j) { j["rope_scaling"]["beta_fast"] = 1; },
       "cfg.json: rope_scaling.beta_fast = 1: must be finite and larger than beta_slow (1)"},
      {"indexer head no wider than rope", [](json& j) { j["index_head_dim"] = 64; },
       "cfg.json: index_head_dim = 64: must be larger than qk_rope_head_dim (64): RoPE rotates the indexer head's "
       "trailing qk_rope_head_dim dims"},
      {"index_topk 0", [](json& j) { j["index_topk"] = 0; },
       "cfg.json: index_topk = 0: must be a positive integer no larger than 16777216"},
      // Routing and experts.
      {"too many experts per token", [](json& j) { j["num_experts_per_tok"] = 257; },
       "cfg.json: num_experts_per_tok = 257: must be between 1 and n_routed_experts (256)"},
      {"negative shared experts", [](json& j) { j["n_shared_experts"] = -1; },
       "cfg.json: n_shared_experts = -1: must be a non-negative integer no larger than 16777216"},
      {"routed_scaling_factor", [](json& j) { j["routed_scaling_factor"] = 0; },
       "cfg.json: routed_scaling_factor = 0: must be a positive finite number"},
      {"hash layers beyond the model", [](json& j) { j["num_hash_layers"] = 44; },
       "cfg.json: num_hash_layers = 44: must be between 0 and num_hidden_layers (43): layers [0, num_hash_layers) "
       "route by ffn.gate.tid2eid[token id]"},
      {"negative clamp", [](json& j) { j["swiglu_limit"] = -10.0; },
       "cfg.json: swiglu_limit = -10: must be 0 (no clamp) or positive (gate <= limit, -limit <= up <= limit)"},
      {"norm_topk_prob not a bool", [](json& j) { j["norm_topk_prob"] = 1; },
       "cfg.json: norm_topk_prob = 1: must be true or false"},
      // Hyper-connections and the rest.
      {"hc_mult 0", [](json& j) { j["hc_mult"] = 0; },
       "cfg.json: hc_mult = 0: must be a positive integer no larger than 16777216"},
      {"hc_sinkhorn_iters 0", [](json& j) { j["hc_sinkhorn_iters"] = 0; },
       "cfg.json: hc_sinkhorn_iters = 0: must be a positive integer (the Sinkhorn projection normalises the columns "
       "once, then alternates rows and columns hc_sinkhorn_iters - 1 times)"},
      {"hc_eps 0", [](json& j) { j["hc_eps"] = 0.0; },
       "cfg.json: hc_eps = 0: must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass uses it in "
       "fp32)"},
      {"rms_norm_eps negative", [](json& j) { j["rms_norm_eps"] = -1e-6; },
       "cfg.json: rms_norm_eps = -1e-06: must lie in fp32's range, between 1.4e-45 and 3.4e+38 (the forward pass "
       "uses it in fp32)"},
      {"negative MTP layers", [](json& j) { j["num_nextn_predict_layers"] = -1; },
       "cfg.json: num_nextn_predict_layers = -1: must be a non-negative integer no larger than 16777216"},
      {"torch_dtype", [](json& j) { j["torch_dtype"] = "float8_e4m3fn"; },
       "cfg.json: torch_dtype = \"float8_e4m3fn\": must be \"bfloat16\", \"float16\" or \"float32\""},
  };
  for (const BadCase& c : cases) {
    json j = flash_bf16();
    c.edit(j);
    EXPECT_EQ(error_of(j), c.message) << c.what;
  }
}

TEST(DeepseekV4Config, round_trips_through_config_json) {
  std::vector<ModelConfig> configs = {parse_model_config(flash_bf16().dump(), "flash").value(),
                                      synthetic_preset_config("tiny-dsv4").value(),
                                      synthetic_preset_config("small-dsv4").value()};
  // YaRN's mscale keys (which V4 does not use) are kept as read.
  json with_mscale = flash_bf16();
  with_mscale["rope_scaling"]["mscale"] = 0.707;
  with_mscale["rope_scaling"]["mscale_all_dim"] = 1.0;
  configs.push_back(parse_model_config(with_mscale.dump(), "mscale").value());
  EXPECT_EQ(configs.back().dsv4.rope_scaling.mscale, 0.707);
  // The FP8 forms write their quantization_config and expert_dtype back.
  configs.push_back(parse_model_config(kDeepseekV4FlashConfig, "flash fp4").value());
  json fp8_experts = json::parse(kDeepseekV4FlashConfig);
  fp8_experts.erase("expert_dtype");
  configs.push_back(parse_model_config(fp8_experts.dump(), "flash fp8").value());
  const json written_fp4 = json::parse(to_config_json(configs[configs.size() - 2]));
  EXPECT_EQ(written_fp4["quantization_config"], json::parse(kDeepseekV4FlashConfig)["quantization_config"]);
  EXPECT_EQ(written_fp4["expert_dtype"], "fp4");
  EXPECT_EQ(json::parse(to_config_json(configs.back()))["expert_dtype"], "fp8");
  for (const ModelConfig& c : configs) {
    ASSERT_TRUE(validate_model_config(c, "code").ok()) << validate_model_config(c, "code").to_string();
    const std::string text = to_config_json(c);
    Result<ModelConfig> back = parse_model_config(text, "back");
    ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
    EXPECT_EQ(*back, c) << text;
  }
  // The written file uses DeepSeek's keys, not Hugging Face's renamed ones.
  const json written = json::parse(to_config_json(configs[0]));
  EXPECT_EQ(written["compress_ratios"], flash_bf16()["compress_ratios"]);
  EXPECT_EQ(written["num_hash_layers"], 3);
  EXPECT_EQ(written["model_type"], "deepseek_v4");
  EXPECT_FALSE(written.contains("layer_types"));
  EXPECT_FALSE(written.contains("quantization_config"));
}

TEST(DeepseekV4Config, validate_keeps_the_families_apart) {
  ModelConfig c = synthetic_preset_config("tiny-dsv4").value();
  c.deepseek.kv_lora_rank = 512;
  EXPECT_EQ(validate_model_config(c, "code").message(),
            "code: the DeepSeek keys are set but the architecture is DeepseekV4ForCausalLM");
  ModelConfig q = synthetic_preset_config("tiny").value();
  q.dsv4.hc_mult = 4;
  EXPECT_EQ(validate_model_config(q, "code").message(),
            "code: the DeepSeek-V4 keys are set but the architecture is Qwen3MoeForCausalLM");
  ModelConfig v4 = synthetic_preset_config("tiny-dsv4").value();
  v4.intermediate_size = 256;
  EXPECT_EQ(validate_model_config(v4, "code").message(),
            "code: mlp_only_layers, decoder_sparse_step, shared_expert_intermediate_size and intermediate_size are not "
            "DeepseekV4ForCausalLM keys: every layer is MoE, with n_shared_experts ungated shared experts");
}

// ---- tensors ----

using testing::RawTensor;
using testing::rewrite;

class DeepseekV4Checkpoint : public ::testing::Test {
 protected:
  std::filesystem::path write(DType dtype = DType::kBF16) {
    const std::filesystem::path d = dir_.path() / fmt::format("tiny-dsv4-{}", dtype_name(dtype));
    EXPECT_TRUE(write_synthetic_checkpoint(synthetic_preset_config("tiny-dsv4").value(), 3, d, 1, dtype).ok());
    return d;
  }
  std::string open_error(const std::filesystem::path& d) {
    Result<Checkpoint> r = Checkpoint::open(d);
    if (r.ok()) return "";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    return r.status().message();
  }
  static RawTensor* find(std::vector<RawTensor>& t, const std::string& name) {
    for (RawTensor& x : t) {
      if (x.spec.name == name) return &x;
    }
    ADD_FAILURE() << "no tensor " << name;
    return nullptr;
  }
  testing::TempDir dir_;
};

// Every view of tiny-dsv4 (compress_ratios [0, 4, 128, 4], layer 0 hash-routed) has the shape checkpoint.h
// gives it, in both precisions; the F32 tensors stay F32 when bf16 weights are asked for.
TEST_F(DeepseekV4Checkpoint, binds_every_tensor_of_tiny_dsv4_in_both_precisions) {
  const std::filesystem::path d = write();
  for (WeightPrecision precision : {WeightPrecision::kBF16, WeightPrecision::kNative}) {
    Result<Checkpoint> r = Checkpoint::open(d, {.precision = precision});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const ModelWeights& w = r->weights();
    EXPECT_EQ(w.embed_tokens.shape_string(), "[512, 128]");
    EXPECT_EQ(w.lm_head.shape_string(), "[512, 128]");
    EXPECT_NE(w.lm_head.data(), w.embed_tokens.data());
    EXPECT_EQ(w.final_norm.shape_string(), "[128]");
    EXPECT_EQ(w.hc_head.fn.shape_string(), "[4, 512]");
    EXPECT_EQ(w.hc_head.base.shape_string(), "[4]");
    EXPECT_EQ(w.hc_head.scale.shape_string(), "[1]");
    ASSERT_EQ(w.layers.size(), 4u);
    for (size_t l = 0; l < 4; ++l) {
      const LayerWeights& lw = w.layers[l];
      SCOPED_TRACE(l);
      EXPECT_TRUE(lw.is_moe);
      EXPECT_EQ(lw.input_layernorm.shape_string(), "[128]");
      EXPECT_EQ(lw.post_attention_layernorm.shape_string(), "[128]");
      EXPECT_EQ(lw.hc_attn.fn.shape_string(), "[24, 512]");
      EXPECT_EQ(lw.hc_ffn.base.shape_string(), "[24]");
      EXPECT_EQ(lw.hc_ffn.scale.shape_string(), "[3]");
      EXPECT_EQ(lw.v4.wq_a.shape_string(), "[64, 128]");
      EXPECT_EQ(lw.v4.q_norm.shape_string(), "[64]");
      EXPECT_EQ(lw.v4.wq_b.shape_string(), "[2048, 64]");  // 4 heads x 512
      EXPECT_EQ(lw.v4.wkv.shape_string(), "[512, 128]");
      EXPECT_EQ(lw.v4.kv_norm.shape_string(), "[512]");
      EXPECT_EQ(lw.v4.wo_a.shape_string(), "[128, 1024]");  // 2 groups x 64, 4 x 512 / 2
      EXPECT_EQ(lw.v4.wo_b.shape_string(), "[128, 128]");
      EXPECT_EQ(lw.v4.attn_sink.shape_string(), "[4]");
      EXPECT_EQ(lw.moe.router.shape_string(), "[8, 128]");
      ASSERT_EQ(lw.moe.experts.size(), 8u);
      EXPECT_EQ(lw.moe.experts[7].gate_proj.shape_string(), "[64, 128]");
      EXPECT_EQ(lw.moe.experts[7].down_proj.shape_string(), "[128, 64]");
      EXPECT_EQ(lw.moe.shared_expert.up_proj.shape_string(), "[64, 128]");
      EXPECT_EQ(lw.moe.shared_expert_gate.data(), nullptr);  // ungated
      // Layer 0 routes by token id (no bias); the others by top-k with the F32 bias.
      EXPECT_EQ(lw.tid2eid.data() != nullptr, l == 0);
      EXPECT_EQ(lw.moe.e_score_correction_bias.data() != nullptr, l != 0);
      for (const TensorView& f32 : {lw.hc_attn.fn, lw.hc_attn.base, lw.hc_attn.scale, lw.hc_ffn.fn, lw.v4.attn_sink}) {
        EXPECT_EQ(f32.dtype(), DType::kF32);
      }
      EXPECT_EQ(lw.v4.wq_b.dtype(), DType::kBF16);
      EXPECT_EQ(lw.v4.kv_norm.dtype(), DType::kBF16);
    }
    const LayerWeights& swa = w.layers[0];
    EXPECT_EQ(swa.v4.compressor.wkv.data(), nullptr);
    EXPECT_EQ(swa.v4.index_wq_b.data(), nullptr);
    EXPECT_EQ(swa.tid2eid.shape_string(), "[512, 2]");
    EXPECT_EQ(swa.tid2eid.dtype(), DType::kI64);
    const LayerWeights& csa = w.layers[1];  // ratio 4: overlapping compressor and the indexer
    EXPECT_EQ(csa.moe.e_score_correction_bias.shape_string(), "[8]");
    EXPECT_EQ(csa.moe.e_score_correction_bias.dtype(), DType::kF32);
    EXPECT_EQ(csa.v4.compressor.wkv.shape_string(), "[1024, 128]");
    EXPECT_EQ(csa.v4.compressor.wgate.shape_string(), "[1024, 128]");
    EXPECT_EQ(csa.v4.compressor.ape.shape_string(), "[4, 1024]");
    EXPECT_EQ(csa.v4.compressor.ape.dtype(), DType::kF32);
    EXPECT_EQ(csa.v4.compressor.norm.shape_string(), "[512]");
    EXPECT_EQ(csa.v4.index_wq_b.shape_string(), "[512, 64]");  // 4 indexer heads x 128
    EXPECT_EQ(csa.v4.index_weights_proj.shape_string(), "[4, 128]");
    EXPECT_EQ(csa.v4.index_compressor.wkv.shape_string(), "[256, 128]");
    EXPECT_EQ(csa.v4.index_compressor.ape.shape_string(), "[4, 256]");
    EXPECT_EQ(csa.v4.index_compressor.ape.dtype(), DType::kF32);
    EXPECT_EQ(csa.v4.index_compressor.norm.shape_string(), "[128]");
    const LayerWeights& hca = w.layers[2];  // ratio 128: no overlap, no indexer
    EXPECT_EQ(hca.v4.compressor.wkv.shape_string(), "[512, 128]");
    EXPECT_EQ(hca.v4.compressor.ape.shape_string(), "[128, 512]");
    EXPECT_EQ(hca.v4.index_wq_b.data(), nullptr);
    EXPECT_EQ(hca.v4.index_compressor.wkv.data(), nullptr);
    EXPECT_EQ(w.layers[3].v4.index_compressor.wgate.shape_string(), "[256, 128]");
    EXPECT_EQ(w.hc_head.fn.dtype(), DType::kF32);
    // The MTP layer's 53 tensors are counted, not bound.
    EXPECT_EQ(r->ignored_tensors(), 53);
    // A bf16 checkpoint converts nothing: BF16 views are zero-copy and the F32 ones are kept.
    EXPECT_EQ(r->converted_weight_bytes(), 0u);
  }
}

// An F32 checkpoint opened for bf16 weights converts every weight but the ones DeepSeek keeps in F32; opened
// natively, nothing is converted.
TEST_F(DeepseekV4Checkpoint, f32_checkpoint_converts_all_but_the_kept_f32_tensors) {
  const std::filesystem::path d = write(DType::kF32);
  const Checkpoint bf16 = Checkpoint::open(d).value();
  const LayerWeights& l1 = bf16.weights().layers[1];
  EXPECT_EQ(bf16.weights().embed_tokens.dtype(), DType::kBF16);
  EXPECT_EQ(l1.v4.wq_b.dtype(), DType::kBF16);
  EXPECT_EQ(l1.v4.compressor.wgate.dtype(), DType::kBF16);
  EXPECT_EQ(l1.v4.index_weights_proj.dtype(), DType::kBF16);
  EXPECT_EQ(l1.input_layernorm.dtype(), DType::kBF16);
  EXPECT_EQ(l1.moe.experts[0].up_proj.dtype(), DType::kBF16);
  for (const TensorView& v :
       {l1.hc_attn.fn, l1.hc_ffn.base, l1.v4.attn_sink, l1.v4.compressor.ape, l1.v4.index_compressor.ape,
        l1.moe.e_score_correction_bias, bf16.weights().hc_head.scale}) {
    EXPECT_EQ(v.dtype(), DType::kF32);
  }
  EXPECT_GT(bf16.converted_weight_bytes(), 0u);
  const Checkpoint native = Checkpoint::open(d, {.precision = WeightPrecision::kNative}).value();
  EXPECT_EQ(native.weights().layers[1].v4.wq_b.dtype(), DType::kF32);
  EXPECT_EQ(native.converted_weight_bytes(), 0u);
  EXPECT_EQ(native.weights().layers[0].tid2eid.dtype(), DType::kI64);
}

TEST_F(DeepseekV4Checkpoint, tid2eid_ids_are_checked_in_range_naming_row_and_value) {
  const std::filesystem::path d = write();
  const std::string name = "layers.0.ffn.gate.tid2eid";
  rewrite(d, [&](std::vector<RawTensor>& t) {
    RawTensor* ids = find(t, name);
    int64_t v = 8;  // n_routed_experts: one past the last expert
    std::memcpy(ids->bytes.data() + (17 * 2 + 1) * sizeof(int64_t), &v, sizeof v);
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.0.ffn.gate.tid2eid' row 17 holds 8 in column 1, outside [0, 8) "
                               "(n_routed_experts = 8)");
  rewrite(d, [&](std::vector<RawTensor>& t) {
    int64_t v = -1;
    std::memcpy(find(t, name)->bytes.data(), &v, sizeof v);
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.0.ffn.gate.tid2eid' row 0 holds -1 in column 0, outside [0, 8) "
                               "(n_routed_experts = 8)");
}

TEST_F(DeepseekV4Checkpoint, tid2eid_is_accepted_as_i32_and_refused_as_a_float) {
  const std::filesystem::path d = write();
  std::vector<int64_t> original;
  rewrite(d, [&](std::vector<RawTensor>& t) {
    RawTensor* ids = find(t, "layers.0.ffn.gate.tid2eid");
    original.resize(ids->bytes.size() / sizeof(int64_t));
    std::memcpy(original.data(), ids->bytes.data(), ids->bytes.size());
    std::vector<char> narrow(original.size() * sizeof(int32_t));
    for (size_t i = 0; i < original.size(); ++i) {
      const auto v = static_cast<int32_t>(original[i]);
      std::memcpy(narrow.data() + i * sizeof v, &v, sizeof v);
    }
    ids->spec.dtype = DType::kI32;
    ids->bytes = narrow;
  });
  {
    Result<Checkpoint> r = Checkpoint::open(d);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const TensorView& ids = r->weights().layers[0].tid2eid;
    ASSERT_EQ(ids.dtype(), DType::kI32);
    for (size_t i = 0; i < original.size(); ++i) ASSERT_EQ(ids.data_as<const int32_t>()[i], original[i]) << i;
  }
  rewrite(d, [&](std::vector<RawTensor>& t) {
    RawTensor* ids = find(t, "layers.0.ffn.gate.tid2eid");
    ids->spec.dtype = DType::kF32;  // the same bytes read as floats
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.0.ffn.gate.tid2eid' has dtype F32 but must be I64 or I32 (expert "
                               "ids; num_hash_layers = 1: layer 0 routes by token id)");
}

// Each row of the synthetic table holds distinct expert ids, every expert appears, and the table is the same
// for the same seed.
TEST_F(DeepseekV4Checkpoint, synthetic_tid2eid_rows_are_distinct_experts) {
  const Checkpoint ck = Checkpoint::open(write()).value();
  const TensorView& ids = ck.weights().layers[0].tid2eid;
  std::vector<int> seen(8, 0);
  for (int64_t r = 0; r < 512; ++r) {
    const int64_t a = ids.data_as<const int64_t>()[2 * r], b = ids.data_as<const int64_t>()[2 * r + 1];
    ASSERT_NE(a, b) << "row " << r;
    ++seen[static_cast<size_t>(a)];
    ++seen[static_cast<size_t>(b)];
  }
  for (int e = 0; e < 8; ++e) EXPECT_GT(seen[static_cast<size_t>(e)], 64) << e;  // 128 expected of each
}

TEST_F(DeepseekV4Checkpoint, kept_f32_tensor_in_another_dtype_is_refused) {
  const std::filesystem::path d = write();
  rewrite(d, [&](std::vector<RawTensor>& t) {
    RawTensor* fn = find(t, "layers.2.hc_ffn_fn");
    std::vector<char> half(fn->bytes.size() / 2);
    for (size_t i = 0; i < half.size() / 2; ++i) std::memcpy(&half[2 * i], &fn->bytes[4 * i + 2], 2);  // bf16
    fn->spec.dtype = DType::kBF16;
    fn->bytes = half;
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.2.hc_ffn_fn' has dtype BF16 but must be F32 (DeepSeek-V4 ships it in "
                               "F32 and genbridge binds it as it is)");
}

// The FP8 + MXFP4 form's tensors in a config without quantization_config (the bf16 form): refused, naming it.
TEST_F(DeepseekV4Checkpoint, fp8_and_fp4_tensors_in_the_bf16_form_are_refused) {
  const std::filesystem::path d = write();
  rewrite(d, [&](std::vector<RawTensor>& t) {
    RawTensor* wq_a = find(t, "layers.1.attn.wq_a.weight");
    wq_a->spec.dtype = DType::kFp8E4M3FN;
    wq_a->bytes.resize(wq_a->bytes.size() / 2);
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.1.attn.wq_a.weight' has dtype F8_E4M3 but config.json has no "
                               "quantization_config, so the checkpoint is in the bf16 form (BF16, F16 or F32 "
                               "weights); DeepSeek's FP8 form needs its quantization_config and expert_dtype "
                               "(docs/deepseek.md)");
  const std::filesystem::path d2 = write(DType::kF16);
  rewrite(d2, [&](std::vector<RawTensor>& t) {
    RawTensor* w1 = find(t, "layers.0.ffn.experts.3.w1.weight");  // [64, 128]: two FP4 values per byte
    w1->spec.dtype = DType::kI8;
    w1->spec.shape = {64, 64};
    w1->bytes.resize(64 * 64);
  });
  EXPECT_EQ(open_error(d2), (d2 / "model.safetensors").string() +
                                ": tensor 'layers.0.ffn.experts.3.w1.weight' has dtype I8 but config.json has no "
                                "quantization_config, so the checkpoint is in the bf16 form (BF16, F16 or F32 "
                                "weights); DeepSeek's FP8 form needs its quantization_config and expert_dtype "
                                "(docs/deepseek.md)");
}

TEST_F(DeepseekV4Checkpoint, missing_tensor_names_it_and_why) {
  const std::filesystem::path d = write();
  for (const auto& [name, why] : std::vector<std::pair<std::string, std::string>>{
           {"layers.3.attn.indexer.compressor.ape", "compress_ratios[3] = 4 (the lightning indexer)"},
           {"layers.2.attn.compressor.norm.weight", "compress_ratios[2] = 128"},
           {"layers.1.ffn.gate.bias", "layer 1 routes by top-k (num_hash_layers = 1)"},
           {"layers.0.hc_attn_scale", "hc_mult = 4 (manifold-constrained hyper-connections)"},
           {"hc_head_fn", "hc_mult = 4 (the streams' collapse before the final norm)"},
           {"head.weight", "tie_word_embeddings is false"}}) {
    const std::filesystem::path m = dir_.path() / "missing";
    std::filesystem::remove_all(m);
    std::filesystem::copy(d, m);
    rewrite(m, [&](std::vector<RawTensor>& t) {
      std::erase_if(t, [&](const RawTensor& x) { return x.spec.name == name; });
    });
    EXPECT_EQ(open_error(m), (m / "model.safetensors").string() + ": tensor '" + name +
                                 "' is missing (config.json requires it: " + why + ")");
  }
}

TEST_F(DeepseekV4Checkpoint, mis_shaped_tensor_names_it_and_the_rule) {
  const std::filesystem::path d = write();
  rewrite(d, [&](std::vector<RawTensor>& t) {
    RawTensor* wo_a = find(t, "layers.1.attn.wo_a.weight");
    wo_a->spec.shape = {1024, 128};
  });
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'layers.1.attn.wo_a.weight' has shape [1024, 128] but config.json requires "
                               "[128, 1024] = [o_groups * o_lora_rank, num_attention_heads * head_dim / o_groups]");
  const std::filesystem::path d2 = write(DType::kF16);
  rewrite(d2, [&](std::vector<RawTensor>& t) {
    RawTensor* ape = find(t, "layers.2.attn.compressor.ape");
    ape->spec.shape = {512, 128};
  });
  EXPECT_EQ(open_error(d2), (d2 / "model.safetensors").string() +
                                ": tensor 'layers.2.attn.compressor.ape' has shape [512, 128] but config.json requires "
                                "[128, 512] = [128, head_dim]");
}

// mtp.* tensors are ignored only when config.json declares the multi-token-prediction layers.
TEST_F(DeepseekV4Checkpoint, mtp_tensors_are_ignored_only_when_declared) {
  const std::filesystem::path d = write();
  ModelConfig c = synthetic_preset_config("tiny-dsv4").value();
  c.dsv4.num_nextn_predict_layers = 0;
  std::ofstream(d / "config.json") << to_config_json(c);
  EXPECT_EQ(open_error(d), (d / "model.safetensors").string() +
                               ": tensor 'mtp.0.attn.attn_sink' is not used by the model config.json describes (53 "
                               "unused tensors; config and weights disagree)");
}

}  // namespace
}  // namespace genbridge::model
