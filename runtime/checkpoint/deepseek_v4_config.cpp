// The DeepSeek-V4 keys of config.json as DeepSeek ships them (docs/deepseek.md, "DeepSeek-V4 checkpoints"):
// every key the forward reads is checked at load, and every key that would change the forward in a way
// genbridge does not implement is refused naming it.
#include "runtime/checkpoint/deepseek_v4_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "runtime/checkpoint/deepseek_config.h"
#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/checkpoint/fp8_checkpoint.h"

namespace genbridge::model {

V4AttentionKind DeepseekV4Config::attention_kind(int64_t layer) const {
  switch (compress_ratio(layer)) {
    case 0:
      return V4AttentionKind::kSlidingWindow;
    case 4:
      return V4AttentionKind::kCompressedSparse;
    default:  // 128: validate_model_config admits no other ratio for a layer
      return V4AttentionKind::kHeavilyCompressed;
  }
}

namespace detail {
namespace {

using json = nlohmann::json;

std::string num(double v) { return fmt::format("{}", v); }

// The first layer (< num_hidden_layers) whose ratio satisfies `pred`, or -1. Safe on an unvalidated config.
template <typename Pred>
int64_t first_layer_where(const ModelConfig& c, Pred pred) {
  const auto& ratios = c.dsv4.compress_ratios;
  const int64_t n = std::min<int64_t>(std::max<int64_t>(c.num_hidden_layers, 0), static_cast<int64_t>(ratios.size()));
  for (int64_t l = 0; l < n; ++l) {
    if (pred(ratios[static_cast<size_t>(l)])) return l;
  }
  return -1;
}
int64_t first_compressed_layer(const ModelConfig& c) {
  return first_layer_where(c, [](int64_t r) { return r != 0; });
}
int64_t first_indexed_layer(const ModelConfig& c) {
  return first_layer_where(c, [](int64_t r) { return r == 4; });
}

// A key that, when present, must hold exactly `want` (a JSON value); `rule` says why.
Status expect_value(const ConfigReader& r, std::string_view key, const json& want, std::string_view rule) {
  if (const json* v = r.find(key); v && *v != want) return r.bad(key, *v, rule);
  return ok_status();
}

Status parse_compress_ratios(const ConfigReader& r, DeepseekV4Config* d) {
  const json* v = r.find("compress_ratios");
  if (!v) return r.missing("compress_ratios");
  if (!v->is_array()) return r.bad("compress_ratios", *v, "must be a list of integers, one per layer");
  for (const json& e : *v) {
    if (!e.is_number_integer()) return r.bad("compress_ratios", *v, "must be a list of integers, one per layer");
    d->compress_ratios.push_back(e.get<int64_t>());
  }
  return ok_status();
}

// quantization_config and expert_dtype: the bf16 form (neither, or expert_dtype "bf16") or DeepSeek's FP8 form
// (quantization_config, read by the Hugging Face FP8 reader, which checks every key) with MXFP4 ("fp4") or FP8
// ("fp8", or absent as DeepSeek's reference code reads it) routed experts.
Status parse_weight_form(const ConfigReader& r, DeepseekV4Config* d) {
  const json* q = r.find("quantization_config");
  const json* e = r.find("expert_dtype");
  if (e && (!e->is_string() || (*e != "bf16" && *e != "fp4" && *e != "fp8"))) {
    return r.bad("expert_dtype", *e,
                 "must be \"fp4\" (MXFP4 routed experts) or \"fp8\" (FP8 block experts) with quantization_config, "
                 "or absent or \"bf16\" without it");
  }
  if (!q) {
    if (e && *e != "bf16") {
      return r.bad("expert_dtype", *e,
                   "describes the routed experts of DeepSeek's FP8 form, which needs a quantization_config (the FP8 "
                   "linears' format); without one the checkpoint is the bf16 form (expert_dtype absent or \"bf16\")");
    }
    d->expert_dtype = V4ExpertDtype::kBf16;
    return ok_status();
  }
  GB_ASSIGN_OR_RETURN(const std::optional<Fp8QuantizationConfig> fp8,
                      read_fp8_quantization_config(json{{"quantization_config", *q}}.dump(), r.source()));
  if (fp8->block.block_n != 128 || fp8->block.block_k != 128) {
    return r.bad("quantization_config.weight_block_size", q->at("weight_block_size"),
                 "must be [128, 128]: DeepSeek-V4's FP8 linears have one scale per 128 x 128 block");
  }
  if (!fp8->block.ue8m0_scales) {
    return invalid_argument(fmt::format(
        "{}: quantization_config.scale_fmt is missing but must be \"ue8m0\": DeepSeek-V4's FP8 scales are powers of "
        "two, which is what makes genbridge's bf16 dequantization exact",
        r.source()));
  }
  if (e && *e == "bf16") {
    return r.bad("expert_dtype", *e,
                 "must be \"fp4\" or \"fp8\" (or absent: FP8) with quantization_config: DeepSeek's FP8 form "
                 "quantizes the routed experts too");
  }
  d->expert_dtype = e && *e == "fp4" ? V4ExpertDtype::kFp4 : V4ExpertDtype::kFp8;
  return ok_status();
}

}  // namespace

Status parse_deepseek_v4_config(const ConfigReader& r, ModelConfig* c) {
  const std::string_view arch = kDeepseekV4Architecture;
  GB_RETURN_IF_ERROR(expect_value(r, "model_type", "deepseek_v4", fmt::format("must be \"deepseek_v4\" for {}", arch)));
  // The weight form decides every tensor's dtype: read first.
  GB_RETURN_IF_ERROR(parse_weight_form(r, &c->dsv4));
  // Hugging Face's conversion renames DeepSeek's keys; genbridge reads DeepSeek's own file.
  for (const char* key : {"layer_types", "mlp_layer_types", "rope_parameters", "partial_rotary_factor"}) {
    if (const json* v = r.find(key)) {
      return r.bad(key, *v,
                   "is Hugging Face's renamed form of the DeepSeek-V4 config; genbridge reads the config.json DeepSeek "
                   "ships (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_theta and rope_scaling)");
    }
  }
  // Features of related configs that DeepSeek-V4 does not have: a value that would turn one on is refused.
  GB_RETURN_IF_ERROR(
      expect_value(r, "attention_bias", false, "must be false (attention projection biases are not supported)"));
  GB_RETURN_IF_ERROR(expect_value(r, "hidden_act", "silu", "must be \"silu\" (experts are SwiGLU)"));
  GB_RETURN_IF_ERROR(expect_value(r, "scoring_func", "sqrtsoftplus",
                                  "must be \"sqrtsoftplus\" (DeepSeek-V4 scores experts with sqrt(softplus(logit)))"));
  GB_RETURN_IF_ERROR(
      expect_value(r, "topk_method", "noaux_tc",
                   "must be \"noaux_tc\" (top-k over the scores plus the selection-only bias ffn.gate.bias)"));
  for (const char* key : {"n_group", "topk_group"}) {
    GB_RETURN_IF_ERROR(
        expect_value(r, key, 1, "must be 1: DeepSeek-V4 routes over all experts, without expert groups"));
  }
  GB_RETURN_IF_ERROR(expect_value(r, "first_k_dense_replace", 0, "must be 0: every DeepSeek-V4 layer is MoE"));
  GB_RETURN_IF_ERROR(expect_value(r, "moe_layer_freq", 1, "must be 1: every DeepSeek-V4 layer is MoE"));
  GB_RETURN_IF_ERROR(
      expect_value(r, kNormTypeKey, "rms", fmt::format("must be \"rms\" for {} (its norms are RMSNorm)", arch)));

  DeepseekV4Config& d = c->dsv4;
  GB_RETURN_IF_ERROR(r.get_int("vocab_size", true, &c->vocab_size));
  GB_RETURN_IF_ERROR(r.get_int("hidden_size", true, &c->hidden_size));
  GB_RETURN_IF_ERROR(r.get_int("num_hidden_layers", true, &c->num_hidden_layers));
  GB_RETURN_IF_ERROR(r.get_int("num_attention_heads", true, &c->num_attention_heads));
  c->num_key_value_heads = 1;  // one shared key = value head; the key may be absent
  GB_RETURN_IF_ERROR(r.get_int("num_key_value_heads", false, &c->num_key_value_heads));
  GB_RETURN_IF_ERROR(r.get_int("head_dim", true, &c->head_dim));
  GB_RETURN_IF_ERROR(r.get_int("qk_rope_head_dim", true, &d.qk_rope_head_dim));
  GB_RETURN_IF_ERROR(r.get_int("q_lora_rank", true, &d.q_lora_rank));
  GB_RETURN_IF_ERROR(r.get_int("o_groups", true, &d.o_groups));
  GB_RETURN_IF_ERROR(r.get_int("o_lora_rank", true, &d.o_lora_rank));
  GB_RETURN_IF_ERROR(r.get_int("sliding_window", true, &d.sliding_window));
  GB_RETURN_IF_ERROR(parse_compress_ratios(r, &d));
  GB_RETURN_IF_ERROR(r.get_double("rms_norm_eps", true, &c->rms_norm_eps));
  GB_RETURN_IF_ERROR(r.get_double("rope_theta", true, &c->rope_theta));
  GB_RETURN_IF_ERROR(r.get_int("max_position_embeddings", false, &c->max_position_embeddings));
  // Conditionally required: the compressed layers' RoPE base, and the indexer of the ratio-4 layers. (DeepSeek's
  // reference code and SGLang default compress_rope_theta to 40000, the shipped configs say 160000: no default.)
  if (const int64_t l = first_compressed_layer(*c); l >= 0 && !r.has("compress_rope_theta")) {
    return invalid_argument(fmt::format("{}: missing required key 'compress_rope_theta' (compress_ratios[{}] = {})",
                                        r.source(), l, d.compress_ratio(l)));
  }
  GB_RETURN_IF_ERROR(r.get_double("compress_rope_theta", false, &d.compress_rope_theta));
  GB_RETURN_IF_ERROR(parse_yarn_rope_scaling(r, &d.rope_scaling, &d.yarn));
  const int64_t indexed = first_indexed_layer(*c);
  for (const auto& [key, out] : {std::pair<const char*, int64_t*>{"index_n_heads", &d.index_n_heads},
                                 {"index_head_dim", &d.index_head_dim},
                                 {"index_topk", &d.index_topk}}) {
    if (indexed >= 0 && !r.has(key)) {
      return invalid_argument(
          fmt::format("{}: missing required key '{}' (compress_ratios[{}] = 4)", r.source(), key, indexed));
    }
    GB_RETURN_IF_ERROR(r.get_int(key, false, out));
  }
  GB_RETURN_IF_ERROR(r.get_int("n_routed_experts", true, &c->num_experts));
  GB_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", true, &c->num_experts_per_tok));
  GB_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", true, &c->moe_intermediate_size));
  GB_RETURN_IF_ERROR(r.get_int("n_shared_experts", true, &d.n_shared_experts));
  GB_RETURN_IF_ERROR(r.get_double("routed_scaling_factor", true, &d.routed_scaling_factor));
  // DeepSeek's reference code always renormalises the top-k weights; the shipped configs say so (true). false
  // is read as vLLM reads it: the weights are not renormalised.
  c->norm_topk_prob = true;
  GB_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &c->norm_topk_prob));
  GB_RETURN_IF_ERROR(r.get_int("num_hash_layers", false, &d.num_hash_layers));
  GB_RETURN_IF_ERROR(r.get_double("swiglu_limit", false, &d.swiglu_limit));
  GB_RETURN_IF_ERROR(r.get_int("hc_mult", true, &d.hc_mult));
  GB_RETURN_IF_ERROR(r.get_int("hc_sinkhorn_iters", true, &d.hc_sinkhorn_iters));
  GB_RETURN_IF_ERROR(r.get_double("hc_eps", true, &d.hc_eps));
  GB_RETURN_IF_ERROR(r.get_int("num_nextn_predict_layers", false, &d.num_nextn_predict_layers));
  GB_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c->tie_word_embeddings));
  return ok_status();
}

namespace {

// Vocabulary, widths, context and the one shared key = value head.
Status check_widths(const ModelConfig& c, std::string_view src) {
  const std::string_view arch = kDeepseekV4Architecture;
  const DeepseekV4Config& d = c.dsv4;
  GB_RETURN_IF_ERROR(check_config_size(src, "vocab_size", c.vocab_size, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "hidden_size", c.hidden_size, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "num_hidden_layers", c.num_hidden_layers, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "num_attention_heads", c.num_attention_heads, 1));
  if (c.num_key_value_heads != 1) {
    return bad_config_value(src, "num_key_value_heads", std::to_string(c.num_key_value_heads),
                            fmt::format("must be 1 for {} (one key = value head shared by every query head)", arch));
  }
  GB_RETURN_IF_ERROR(check_config_size(src, "head_dim", c.head_dim, 1));
  if (c.num_attention_heads * c.head_dim > kMaxConfigSize) {
    return bad_config_value(src, "head_dim", std::to_string(c.head_dim),
                            fmt::format("num_attention_heads * head_dim must be no larger than {}", kMaxConfigSize));
  }
  if (d.qk_rope_head_dim < 2 || d.qk_rope_head_dim % 2 != 0 || d.qk_rope_head_dim >= c.head_dim) {
    return bad_config_value(src, "qk_rope_head_dim", std::to_string(d.qk_rope_head_dim),
                            fmt::format("must be even, positive and smaller than head_dim ({}): RoPE rotates pairs of "
                                        "each head's trailing qk_rope_head_dim dims",
                                        c.head_dim));
  }
  GB_RETURN_IF_ERROR(check_config_size(src, "q_lora_rank", d.q_lora_rank, 1));
  if (d.o_groups < 1 || c.num_attention_heads % d.o_groups != 0) {
    return bad_config_value(
        src, "o_groups", std::to_string(d.o_groups),
        fmt::format("must be a positive divisor of num_attention_heads ({}): the output projection takes the heads "
                    "in o_groups equal groups",
                    c.num_attention_heads));
  }
  GB_RETURN_IF_ERROR(check_config_size(src, "o_lora_rank", d.o_lora_rank, 1));
  if (d.o_groups * d.o_lora_rank > kMaxConfigSize) {
    return bad_config_value(src, "o_lora_rank", std::to_string(d.o_lora_rank),
                            fmt::format("o_groups * o_lora_rank must be no larger than {}", kMaxConfigSize));
  }
  GB_RETURN_IF_ERROR(check_config_size(src, "sliding_window", d.sliding_window, 1));
  if (c.max_position_embeddings < 1 || c.max_position_embeddings > (int64_t{1} << 31)) {
    return bad_config_value(src, "max_position_embeddings", std::to_string(c.max_position_embeddings),
                            "must be a positive integer no larger than 2147483648");
  }
  return ok_status();
}

// The layer schedule and its RoPE: compress_ratios, the two thetas, YaRN, the indexer.
Status check_attention_schedule(const ModelConfig& c, std::string_view src) {
  const DeepseekV4Config& d = c.dsv4;
  const auto n = static_cast<int64_t>(d.compress_ratios.size());
  if (n < c.num_hidden_layers) {
    return bad_config_value(src, "compress_ratios", fmt::format("a list of {}", n),
                            fmt::format("must have an entry for each of the num_hidden_layers ({}) layers (entries "
                                        "after them belong to the multi-token-prediction layers)",
                                        c.num_hidden_layers));
  }
  for (int64_t l = 0; l < n; ++l) {
    const int64_t ratio = d.compress_ratios[static_cast<size_t>(l)];
    if (l < c.num_hidden_layers && ratio != 0 && ratio != 4 && ratio != 128) {
      return bad_config_value(src, fmt::format("compress_ratios[{}]", l), std::to_string(ratio),
                              "a layer's ratio must be 0 (sliding window only), 4 (compressed sparse attention with "
                              "the lightning indexer) or 128 (heavily compressed attention)");
    }
    if (ratio < 0 || ratio > kMaxConfigSize) {
      return bad_config_value(src, fmt::format("compress_ratios[{}]", l), std::to_string(ratio),
                              "must be a non-negative integer (a multi-token-prediction layer's ratio, kept as read)");
    }
  }
  GB_RETURN_IF_ERROR(check_fp32_positive(src, "rms_norm_eps", c.rms_norm_eps));
  GB_RETURN_IF_ERROR(check_fp32_positive(src, "rope_theta", c.rope_theta));
  if (first_compressed_layer(c) >= 0 || d.compress_rope_theta != 0) {
    GB_RETURN_IF_ERROR(check_fp32_positive(src, "compress_rope_theta", d.compress_rope_theta));
  }
  if (d.yarn) GB_RETURN_IF_ERROR(check_yarn_rope_scaling(d.rope_scaling, src));
  if (first_indexed_layer(c) >= 0 || d.index_n_heads != 0 || d.index_head_dim != 0 || d.index_topk != 0) {
    GB_RETURN_IF_ERROR(check_config_size(src, "index_n_heads", d.index_n_heads, 1));
    GB_RETURN_IF_ERROR(check_config_size(src, "index_head_dim", d.index_head_dim, 1));
    if (d.index_head_dim <= d.qk_rope_head_dim) {
      return bad_config_value(src, "index_head_dim", std::to_string(d.index_head_dim),
                              fmt::format("must be larger than qk_rope_head_dim ({}): RoPE rotates the indexer head's "
                                          "trailing qk_rope_head_dim dims",
                                          d.qk_rope_head_dim));
    }
    if (d.index_n_heads * d.index_head_dim > kMaxConfigSize) {
      return bad_config_value(src, "index_head_dim", std::to_string(d.index_head_dim),
                              fmt::format("index_n_heads * index_head_dim must be no larger than {}", kMaxConfigSize));
    }
    GB_RETURN_IF_ERROR(check_config_size(src, "index_topk", d.index_topk, 1));
  }
  return ok_status();
}

// Routing (top-k and hash layers), the experts and their clamp.
Status check_moe(const ModelConfig& c, std::string_view src) {
  const DeepseekV4Config& d = c.dsv4;
  GB_RETURN_IF_ERROR(check_config_size(src, "n_routed_experts", c.num_experts, 1));
  if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
    return bad_config_value(src, "num_experts_per_tok", std::to_string(c.num_experts_per_tok),
                            fmt::format("must be between 1 and n_routed_experts ({})", c.num_experts));
  }
  GB_RETURN_IF_ERROR(check_config_size(src, "moe_intermediate_size", c.moe_intermediate_size, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "n_shared_experts", d.n_shared_experts, 0));
  if (d.n_shared_experts * c.moe_intermediate_size > kMaxConfigSize) {
    return bad_config_value(
        src, "n_shared_experts", std::to_string(d.n_shared_experts),
        fmt::format("n_shared_experts * moe_intermediate_size must be no larger than {}", kMaxConfigSize));
  }
  GB_RETURN_IF_ERROR(check_routed_scaling_factor(d.routed_scaling_factor, src));
  if (d.expert_dtype == V4ExpertDtype::kFp4) {
    for (const auto& [key, v] : {std::pair<const char*, int64_t>{"hidden_size", c.hidden_size},
                                 {"moe_intermediate_size", c.moe_intermediate_size}}) {
      if (v % kMxfp4BlockK != 0) {
        return bad_config_value(src, key, std::to_string(v),
                                fmt::format("must be a multiple of {} with expert_dtype \"fp4\": an MXFP4 routed "
                                            "expert has one E8M0 scale per {} inputs",
                                            kMxfp4BlockK, kMxfp4BlockK));
      }
    }
  }
  if (d.num_hash_layers < 0 || d.num_hash_layers > c.num_hidden_layers) {
    return bad_config_value(src, "num_hash_layers", std::to_string(d.num_hash_layers),
                            fmt::format("must be between 0 and num_hidden_layers ({}): layers [0, num_hash_layers) "
                                        "route by ffn.gate.tid2eid[token id]",
                                        c.num_hidden_layers));
  }
  if (d.swiglu_limit != 0) {
    if (!(d.swiglu_limit > 0)) {
      return bad_config_value(src, "swiglu_limit", num(d.swiglu_limit),
                              "must be 0 (no clamp) or positive (gate <= limit, -limit <= up <= limit)");
    }
    GB_RETURN_IF_ERROR(check_fp32_positive(src, "swiglu_limit", d.swiglu_limit));
  }
  return ok_status();
}

// The hyper-connections, the multi-token-prediction layers and what DeepSeek-V4 configs do not hold.
Status check_hyper_connections_and_rest(const ModelConfig& c, std::string_view src) {
  const std::string_view arch = kDeepseekV4Architecture;
  const DeepseekV4Config& d = c.dsv4;
  GB_RETURN_IF_ERROR(check_config_size(src, "hc_mult", d.hc_mult, 1));
  if ((2 + d.hc_mult) * d.hc_mult > kMaxConfigSize || d.hc_mult * c.hidden_size > kMaxConfigSize) {
    return bad_config_value(src, "hc_mult", std::to_string(d.hc_mult),
                            fmt::format("(2 + hc_mult) * hc_mult and hc_mult * hidden_size (hc_attn_fn's dims) must "
                                        "be no larger than {}",
                                        kMaxConfigSize));
  }
  if (d.hc_sinkhorn_iters < 1 || d.hc_sinkhorn_iters > kMaxConfigSize) {
    return bad_config_value(src, "hc_sinkhorn_iters", std::to_string(d.hc_sinkhorn_iters),
                            "must be a positive integer (the Sinkhorn projection normalises the columns once, then "
                            "alternates rows and columns hc_sinkhorn_iters - 1 times)");
  }
  GB_RETURN_IF_ERROR(check_fp32_positive(src, "hc_eps", d.hc_eps));
  GB_RETURN_IF_ERROR(check_config_size(src, "num_nextn_predict_layers", d.num_nextn_predict_layers, 0));
  if (c.norm_type != NormType::kRms) {
    return bad_config_value(src, kNormTypeKey, std::string(norm_type_name(c.norm_type)),
                            fmt::format("must be \"rms\" for {}", arch));
  }
  if (!c.mlp_only_layers.empty() || c.decoder_sparse_step != 1 || c.shared_expert_intermediate_size != 0 ||
      c.intermediate_size != 0) {
    return invalid_argument(fmt::format(
        "{}: mlp_only_layers, decoder_sparse_step, shared_expert_intermediate_size and intermediate_size are not {} "
        "keys: every layer is MoE, with n_shared_experts ungated shared experts",
        src, arch));
  }
  if (c.torch_dtype != DType::kBF16 && c.torch_dtype != DType::kF16 && c.torch_dtype != DType::kF32) {
    return bad_config_value(src, "torch_dtype", std::string(dtype_name(c.torch_dtype)),
                            "must be bfloat16, float16 or float32");
  }
  return ok_status();
}

}  // namespace

Status validate_deepseek_v4_config(const ModelConfig& c, std::string_view src) {
  GB_RETURN_IF_ERROR(check_widths(c, src));
  GB_RETURN_IF_ERROR(check_attention_schedule(c, src));
  GB_RETURN_IF_ERROR(check_moe(c, src));
  return check_hyper_connections_and_rest(c, src);
}

std::string deepseek_v4_config_json(const ModelConfig& c, std::string_view torch_dtype) {
  const DeepseekV4Config& d = c.dsv4;
  // DeepSeek's file lists its keys alphabetically, the two compression keys last; so does this one.
  nlohmann::ordered_json j;
  j["architectures"] = {std::string(kDeepseekV4Architecture)};
  j["attention_bias"] = false;
  if (d.quantized()) j["expert_dtype"] = d.expert_dtype == V4ExpertDtype::kFp4 ? "fp4" : "fp8";
  j["hc_eps"] = d.hc_eps;
  j["hc_mult"] = d.hc_mult;
  j["hc_sinkhorn_iters"] = d.hc_sinkhorn_iters;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden_size;
  if (d.index_n_heads != 0 || d.index_head_dim != 0 || d.index_topk != 0) {
    j["index_head_dim"] = d.index_head_dim;
    j["index_n_heads"] = d.index_n_heads;
    j["index_topk"] = d.index_topk;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["model_type"] = "deepseek_v4";
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] = d.n_shared_experts;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_hash_layers"] = d.num_hash_layers;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["num_nextn_predict_layers"] = d.num_nextn_predict_layers;
  j["o_groups"] = d.o_groups;
  j["o_lora_rank"] = d.o_lora_rank;
  j["q_lora_rank"] = d.q_lora_rank;
  j["qk_rope_head_dim"] = d.qk_rope_head_dim;
  if (d.quantized()) {
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "e4m3"},
                                {"quant_method", "fp8"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}}};
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (d.yarn) {
    const YarnRopeScaling& s = d.rope_scaling;
    nlohmann::ordered_json rs = {{"beta_fast", s.beta_fast},
                                 {"beta_slow", s.beta_slow},
                                 {"factor", s.factor},
                                 {"original_max_position_embeddings", s.original_max_position_embeddings},
                                 {"type", "yarn"}};
    // DeepSeek-V4 does not use YaRN's mscale (attention factor 1); written back only when the file had it.
    const YarnRopeScaling defaults;
    if (s.mscale != defaults.mscale) rs["mscale"] = s.mscale;
    if (s.mscale_all_dim != defaults.mscale_all_dim) rs["mscale_all_dim"] = s.mscale_all_dim;
    j["rope_scaling"] = rs;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_theta"] = c.rope_theta;
  j["routed_scaling_factor"] = d.routed_scaling_factor;
  j["scoring_func"] = "sqrtsoftplus";
  j["sliding_window"] = d.sliding_window;
  j["swiglu_limit"] = d.swiglu_limit;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["topk_method"] = "noaux_tc";
  j["torch_dtype"] = std::string(torch_dtype);
  j["vocab_size"] = c.vocab_size;
  if (d.compress_rope_theta != 0) j["compress_rope_theta"] = d.compress_rope_theta;
  j["compress_ratios"] = d.compress_ratios;
  return j.dump(2) + "\n";
}

std::string describe_deepseek_v4(const ModelConfig& c) {
  const DeepseekV4Config& d = c.dsv4;
  int64_t window = 0, sparse = 0, heavy = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    switch (d.attention_kind(l)) {
      case V4AttentionKind::kSlidingWindow:
        ++window;
        break;
      case V4AttentionKind::kCompressedSparse:
        ++sparse;
        break;
      case V4AttentionKind::kHeavilyCompressed:
        ++heavy;
        break;
    }
  }
  return fmt::format(
      "{} {} layers ({} sliding-window, {} compressed-sparse /4{}, {} heavily-compressed /128; window {}; all MoE: "
      "{} experts, top-{}{}, sqrt-softplus{}), hidden {}, {} heads x {} (rope {}) over 1 shared KV head, q_lora_rank "
      "{}, output {} groups x {}, {} hyper-connection streams{}, vocab {}{}",
      kDeepseekV4Architecture, c.num_hidden_layers, window, sparse,
      sparse > 0 ? fmt::format(" (indexer {} x {} top-{})", d.index_n_heads, d.index_head_dim, d.index_topk) : "",
      heavy, d.sliding_window, c.num_experts, c.num_experts_per_tok,
      d.n_shared_experts > 0 ? fmt::format(" + {} shared", d.n_shared_experts) : "",
      d.num_hash_layers > 0 ? fmt::format(", {} hash-routed", d.num_hash_layers) : "", c.hidden_size,
      c.num_attention_heads, c.head_dim, d.qk_rope_head_dim, d.q_lora_rank, d.o_groups, d.o_lora_rank, d.hc_mult,
      d.yarn ? fmt::format(", YaRN x{} on the compressed layers", d.rope_scaling.factor) : "", c.vocab_size,
      !d.quantized()                          ? ""
      : d.expert_dtype == V4ExpertDtype::kFp4 ? "; FP8 linears, MXFP4 routed experts (dequantized to bf16 at load)"
                                              : "; FP8 linears and routed experts (dequantized to bf16 at load)");
}

}  // namespace detail
}  // namespace genbridge::model
