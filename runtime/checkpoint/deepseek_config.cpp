// The DeepSeek-V3 / V3.2 keys of config.json: HF's names, every inconsistent key a load-time error naming it.
#include "runtime/checkpoint/deepseek_config.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

namespace genbridge::model::detail {
namespace {

using json = nlohmann::json;

bool finite_positive(double v) { return v > 0.0 && std::isfinite(v); }

// Just below sqrt(FLT_MAX) = 1.8447e19 (docs/deepseek.md).
constexpr double kMaxRoutedScalingFactor = 1.8e19;

std::string num(double v) { return fmt::format("{}", v); }

}  // namespace

Status parse_yarn_rope_scaling(const ConfigReader& r, YarnRopeScaling* s, bool* yarn) {
  const json* rs = r.find("rope_scaling");
  if (!rs) return ok_status();
  if (!rs->is_object()) return r.bad("rope_scaling", *rs, "must be null or an object with \"type\": \"yarn\"");
  ConfigReader y(*rs, r.source());
  const char* type_key = y.has("type") ? "type" : (y.has("rope_type") ? "rope_type" : nullptr);
  if (!type_key) return r.bad("rope_scaling", *rs, "must name its type (\"type\": \"yarn\")");
  const json& type = *y.find(type_key);
  if (!type.is_string() || type.get<std::string>() != "yarn") {
    return r.bad(fmt::format("rope_scaling.{}", type_key), type,
                 "must be \"yarn\" (the only RoPE scaling DeepSeek models use)");
  }
  const auto get_d = [&](const char* key, bool required, double* out) -> Status {
    const json* v = y.find(key);
    if (!v) return required ? r.missing(fmt::format("rope_scaling.{}", key)) : ok_status();
    if (!v->is_number()) return r.bad(fmt::format("rope_scaling.{}", key), *v, "must be a number");
    *out = v->get<double>();
    return ok_status();
  };
  GB_RETURN_IF_ERROR(get_d("factor", true, &s->factor));
  if (const json* v = y.find("original_max_position_embeddings")) {
    if (!v->is_number_integer()) {
      return r.bad("rope_scaling.original_max_position_embeddings", *v, "must be an integer");
    }
    s->original_max_position_embeddings = v->get<int64_t>();
  } else {
    return r.missing("rope_scaling.original_max_position_embeddings");
  }
  GB_RETURN_IF_ERROR(get_d("beta_fast", false, &s->beta_fast));
  GB_RETURN_IF_ERROR(get_d("beta_slow", false, &s->beta_slow));
  GB_RETURN_IF_ERROR(get_d("mscale", false, &s->mscale));
  GB_RETURN_IF_ERROR(get_d("mscale_all_dim", false, &s->mscale_all_dim));
  *yarn = true;
  return ok_status();
}

Status check_routed_scaling_factor(double v, std::string_view src) {
  if (!finite_positive(v)) {
    return bad_config_value(src, "routed_scaling_factor", num(v), "must be a positive finite number");
  }
  if (v > kMaxRoutedScalingFactor) {
    return bad_config_value(
        src, "routed_scaling_factor", num(v),
        fmt::format("must be at most {:g}: the scaled expert outputs enter the residual stream, and the next "
                    "RMSNorm's fp32 sum of squares overflows once an element reaches {:g} (the square root of fp32's "
                    "maximum), so any expert output of magnitude 1 or more would overflow",
                    kMaxRoutedScalingFactor, kMaxRoutedScalingFactor));
  }
  return check_fp32_positive(src, "routed_scaling_factor", v);
}

Status check_yarn_rope_scaling(const YarnRopeScaling& s, std::string_view src) {
  if (!(s.factor >= 1.0) || !std::isfinite(s.factor)) {
    return bad_config_value(src, "rope_scaling.factor", num(s.factor), "must be a finite number >= 1");
  }
  if (s.original_max_position_embeddings < 1 || s.original_max_position_embeddings > (int64_t{1} << 31)) {
    return bad_config_value(src, "rope_scaling.original_max_position_embeddings",
                            std::to_string(s.original_max_position_embeddings),
                            "must be a positive integer no larger than 2147483648");
  }
  if (!finite_positive(s.beta_slow)) {
    return bad_config_value(src, "rope_scaling.beta_slow", num(s.beta_slow), "must be a positive finite number");
  }
  if (!(s.beta_fast > s.beta_slow) || !std::isfinite(s.beta_fast)) {
    return bad_config_value(src, "rope_scaling.beta_fast", num(s.beta_fast),
                            fmt::format("must be finite and larger than beta_slow ({})", s.beta_slow));
  }
  if (!(s.mscale >= 0.0) || !std::isfinite(s.mscale)) {
    return bad_config_value(src, "rope_scaling.mscale", num(s.mscale), "must be a non-negative finite number");
  }
  if (!(s.mscale_all_dim >= 0.0) || !std::isfinite(s.mscale_all_dim)) {
    return bad_config_value(src, "rope_scaling.mscale_all_dim", num(s.mscale_all_dim),
                            "must be a non-negative finite number");
  }
  return ok_status();
}

Status parse_deepseek_config(const ConfigReader& r, ModelConfig* c) {
  const bool v32 = c->architecture == Architecture::kDeepseekV32;
  const std::string_view arch = architecture_name(c->architecture);
  if (const json* mt = r.find("model_type")) {
    const char* want = v32 ? "deepseek_v32" : "deepseek_v3";
    if (!mt->is_string() || mt->get<std::string>() != want) {
      return r.bad("model_type", *mt, fmt::format("must be \"{}\" for {}", want, arch));
    }
  }
  if (const json* v = r.find("attention_bias"); v && !(v->is_boolean() && !v->get<bool>())) {
    return r.bad("attention_bias", *v, "must be false (attention projection biases are not supported)");
  }
  if (const json* v = r.find("hidden_act"); v && !(v->is_string() && v->get<std::string>() == "silu")) {
    return r.bad("hidden_act", *v, "must be \"silu\" (experts and dense layers are SwiGLU)");
  }
  if (const json* v = r.find("scoring_func"); v && !(v->is_string() && v->get<std::string>() == "sigmoid")) {
    return r.bad("scoring_func", *v, "must be \"sigmoid\" (DeepSeek-V3 routing scores experts with a sigmoid)");
  }
  if (const json* v = r.find("topk_method"); v && !(v->is_string() && v->get<std::string>() == "noaux_tc")) {
    return r.bad("topk_method", *v,
                 "must be \"noaux_tc\" (group-limited top-k over sigmoid scores plus e_score_correction_bias)");
  }
  if (const json* v = r.find("rope_interleave"); v && !(v->is_boolean() && v->get<bool>())) {
    return r.bad("rope_interleave", *v, "must be true (MLA's RoPE is the interleaved complex-pair form)");
  }
  if (const json* v = r.find(kNormTypeKey); v && !(v->is_string() && v->get<std::string>() == "rms")) {
    return r.bad(kNormTypeKey, *v, fmt::format("must be \"rms\" for {} (its norms are RMSNorm)", arch));
  }
  DeepseekConfig& d = c->deepseek;
  GB_RETURN_IF_ERROR(r.get_int("vocab_size", true, &c->vocab_size));
  GB_RETURN_IF_ERROR(r.get_int("hidden_size", true, &c->hidden_size));
  GB_RETURN_IF_ERROR(r.get_int("num_hidden_layers", true, &c->num_hidden_layers));
  GB_RETURN_IF_ERROR(r.get_int("num_attention_heads", true, &c->num_attention_heads));
  c->num_key_value_heads = c->num_attention_heads;  // HF's default; MLA has no separate kv heads
  GB_RETURN_IF_ERROR(r.get_int("num_key_value_heads", false, &c->num_key_value_heads));
  GB_RETURN_IF_ERROR(r.get_double("rms_norm_eps", true, &c->rms_norm_eps));
  GB_RETURN_IF_ERROR(r.get_double("rope_theta", true, &c->rope_theta));
  GB_RETURN_IF_ERROR(r.get_int("max_position_embeddings", false, &c->max_position_embeddings));
  GB_RETURN_IF_ERROR(r.get_int("q_lora_rank", false, &d.q_lora_rank));
  GB_RETURN_IF_ERROR(r.get_int("kv_lora_rank", true, &d.kv_lora_rank));
  GB_RETURN_IF_ERROR(r.get_int("qk_nope_head_dim", true, &d.qk_nope_head_dim));
  GB_RETURN_IF_ERROR(r.get_int("qk_rope_head_dim", true, &d.qk_rope_head_dim));
  GB_RETURN_IF_ERROR(r.get_int("v_head_dim", true, &d.v_head_dim));
  c->head_dim = d.qk_nope_head_dim + d.qk_rope_head_dim;
  GB_RETURN_IF_ERROR(r.get_int("n_routed_experts", true, &c->num_experts));
  GB_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", true, &c->num_experts_per_tok));
  GB_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", true, &c->moe_intermediate_size));
  GB_RETURN_IF_ERROR(r.get_int("n_shared_experts", true, &d.n_shared_experts));
  GB_RETURN_IF_ERROR(r.get_int("n_group", true, &d.n_group));
  GB_RETURN_IF_ERROR(r.get_int("topk_group", true, &d.topk_group));
  GB_RETURN_IF_ERROR(r.get_double("routed_scaling_factor", true, &d.routed_scaling_factor));
  if (!r.has("norm_topk_prob")) return r.missing("norm_topk_prob");
  GB_RETURN_IF_ERROR(r.get_bool("norm_topk_prob", &c->norm_topk_prob));
  GB_RETURN_IF_ERROR(r.get_int("first_k_dense_replace", true, &d.first_k_dense_replace));
  GB_RETURN_IF_ERROR(r.get_int("moe_layer_freq", false, &d.moe_layer_freq));
  GB_RETURN_IF_ERROR(r.get_int("num_nextn_predict_layers", false, &d.num_nextn_predict_layers));
  if (d.first_k_dense_replace > 0 && !r.has("intermediate_size")) {
    return invalid_argument(fmt::format("{}: missing required key 'intermediate_size' (first_k_dense_replace = {})",
                                        r.source(), d.first_k_dense_replace));
  }
  GB_RETURN_IF_ERROR(r.get_int("intermediate_size", false, &c->intermediate_size));
  GB_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c->tie_word_embeddings));
  GB_RETURN_IF_ERROR(parse_yarn_rope_scaling(r, &d.rope_scaling, &d.yarn));
  for (const char* key : {"index_n_heads", "index_head_dim", "index_topk"}) {
    if (!v32 && r.has(key)) {
      return r.bad(
          key, *r.find(key),
          fmt::format("only {} has the lightning indexer (this config is {})", kDeepseekV32Architecture, arch));
    }
  }
  if (v32) {
    GB_RETURN_IF_ERROR(r.get_int("index_n_heads", true, &d.index_n_heads));
    GB_RETURN_IF_ERROR(r.get_int("index_head_dim", true, &d.index_head_dim));
    GB_RETURN_IF_ERROR(r.get_int("index_topk", true, &d.index_topk));
  }
  return ok_status();
}

namespace {
// The vocabulary, hidden and attention widths, norm epsilon, rope theta and context length.
Status check_dense_widths(const ModelConfig& c, std::string_view src) {
  const std::string_view arch = architecture_name(c.architecture);
  GB_RETURN_IF_ERROR(check_config_size(src, "vocab_size", c.vocab_size, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "hidden_size", c.hidden_size, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "num_hidden_layers", c.num_hidden_layers, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "num_attention_heads", c.num_attention_heads, 1));
  if (c.num_key_value_heads != c.num_attention_heads) {
    return bad_config_value(src, "num_key_value_heads", std::to_string(c.num_key_value_heads),
                            fmt::format("must equal num_attention_heads ({}) for {} (MLA shares one latent per token)",
                                        c.num_attention_heads, arch));
  }
  if (!finite_positive(c.rms_norm_eps)) {
    return bad_config_value(src, "rms_norm_eps", num(c.rms_norm_eps), "must be a positive finite number");
  }
  if (!finite_positive(c.rope_theta)) {
    return bad_config_value(src, "rope_theta", num(c.rope_theta), "must be a positive finite number");
  }
  GB_RETURN_IF_ERROR(check_fp32_positive(src, "rms_norm_eps", c.rms_norm_eps));
  GB_RETURN_IF_ERROR(check_fp32_positive(src, "rope_theta", c.rope_theta));
  if (c.max_position_embeddings < 1 || c.max_position_embeddings > (int64_t{1} << 31)) {
    return bad_config_value(src, "max_position_embeddings", std::to_string(c.max_position_embeddings),
                            "must be a positive integer no larger than 2147483648");
  }
  return ok_status();
}

// The MLA widths: the latent ranks and the query/key/value head splits.
Status check_mla_widths(const ModelConfig& c, std::string_view src) {
  const DeepseekConfig& d = c.deepseek;
  GB_RETURN_IF_ERROR(check_config_size(src, "q_lora_rank", d.q_lora_rank, 0));
  GB_RETURN_IF_ERROR(check_config_size(src, "kv_lora_rank", d.kv_lora_rank, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "qk_nope_head_dim", d.qk_nope_head_dim, 1));
  GB_RETURN_IF_ERROR(check_config_size(src, "qk_rope_head_dim", d.qk_rope_head_dim, 1));
  if (d.qk_rope_head_dim % 2 != 0) {
    return bad_config_value(src, "qk_rope_head_dim", std::to_string(d.qk_rope_head_dim),
                            "must be even (RoPE rotates pairs of dimensions)");
  }
  GB_RETURN_IF_ERROR(check_config_size(src, "v_head_dim", d.v_head_dim, 1));
  if (c.head_dim != d.qk_head_dim()) {
    return bad_config_value(src, "head_dim", std::to_string(c.head_dim),
                            fmt::format("must be qk_nope_head_dim + qk_rope_head_dim = {}", d.qk_head_dim()));
  }
  return ok_status();
}

// The routed experts and their groups, which layers are dense, and the multi-token-prediction layers.
Status check_routing(const ModelConfig& c, std::string_view src) {
  const DeepseekConfig& d = c.deepseek;
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
  if (d.n_group < 1 || d.n_group > c.num_experts || c.num_experts % d.n_group != 0) {
    return bad_config_value(src, "n_group", std::to_string(d.n_group),
                            fmt::format("must be a positive divisor of n_routed_experts ({})", c.num_experts));
  }
  const int64_t group_size = c.num_experts / d.n_group;
  if (d.n_group > 1 && group_size < 2) {
    return bad_config_value(src, "n_group", std::to_string(d.n_group),
                            fmt::format("leaves {} expert per group; a group's score is the sum of its best two "
                                        "experts, so each group needs at least 2",
                                        group_size));
  }
  if (d.topk_group < 1 || d.topk_group > d.n_group) {
    return bad_config_value(src, "topk_group", std::to_string(d.topk_group),
                            fmt::format("must be between 1 and n_group ({})", d.n_group));
  }
  if (c.num_experts_per_tok > d.topk_group * group_size) {
    return bad_config_value(
        src, "num_experts_per_tok", std::to_string(c.num_experts_per_tok),
        fmt::format("must be at most topk_group * n_routed_experts / n_group = {} * {} (the experts of the chosen "
                    "groups)",
                    d.topk_group, group_size));
  }
  GB_RETURN_IF_ERROR(check_routed_scaling_factor(d.routed_scaling_factor, src));
  if (d.first_k_dense_replace < 0 || d.first_k_dense_replace > c.num_hidden_layers) {
    return bad_config_value(src, "first_k_dense_replace", std::to_string(d.first_k_dense_replace),
                            fmt::format("must be between 0 and num_hidden_layers ({})", c.num_hidden_layers));
  }
  if (d.moe_layer_freq < 1 || d.moe_layer_freq > kMaxConfigSize) {
    return bad_config_value(src, "moe_layer_freq", std::to_string(d.moe_layer_freq),
                            "must be a positive integer (1: every layer from first_k_dense_replace on is MoE)");
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) {
      if (c.intermediate_size < 1 || c.intermediate_size > kMaxConfigSize) {
        return bad_config_value(
            src, "intermediate_size", std::to_string(c.intermediate_size),
            fmt::format("must be a positive integer no larger than {} because layer {} is dense", kMaxConfigSize, l));
      }
      break;
    }
  }
  GB_RETURN_IF_ERROR(check_config_size(src, "num_nextn_predict_layers", d.num_nextn_predict_layers, 0));
  return ok_status();
}

// YaRN rope scaling (when rope_scaling is yarn).
Status check_yarn(const ModelConfig& c, std::string_view src) {
  const DeepseekConfig& d = c.deepseek;
  if (d.yarn) {
    const YarnRopeScaling& s = d.rope_scaling;
    GB_RETURN_IF_ERROR(check_yarn_rope_scaling(s, src));
    if (s.mscale != s.mscale_all_dim) {
      return bad_config_value(
          src, "rope_scaling.mscale", num(s.mscale),
          fmt::format("must equal mscale_all_dim ({}): genbridge applies YaRN's attention scaling once, as the "
                      "softmax-scale correction, and does not scale RoPE's cos/sin",
                      s.mscale_all_dim));
    }
  }
  return ok_status();
}

// The lightning indexer: present exactly for V3.2, with widths RoPE can rotate.
Status check_indexer(const ModelConfig& c, std::string_view src) {
  const DeepseekConfig& d = c.deepseek;
  const std::string_view arch = architecture_name(c.architecture);
  if (c.has_indexer()) {
    if (d.q_lora_rank < 1) {
      return bad_config_value(
          src, "q_lora_rank", std::to_string(d.q_lora_rank),
          fmt::format("must be positive for {} (the indexer's queries come from the q latent)", arch));
    }
    GB_RETURN_IF_ERROR(check_config_size(src, "index_n_heads", d.index_n_heads, 1));
    GB_RETURN_IF_ERROR(check_config_size(src, "index_head_dim", d.index_head_dim, 1));
    if (d.index_head_dim < d.qk_rope_head_dim) {
      return bad_config_value(src, "index_head_dim", std::to_string(d.index_head_dim),
                              fmt::format("must be at least qk_rope_head_dim ({}): RoPE rotates the indexer "
                                          "head's first qk_rope_head_dim dimensions",
                                          d.qk_rope_head_dim));
    }
    GB_RETURN_IF_ERROR(check_config_size(src, "index_topk", d.index_topk, 1));
  } else if (d.index_n_heads != 0 || d.index_head_dim != 0 || d.index_topk != 0) {
    return bad_config_value(src, "index_topk", std::to_string(d.index_topk),
                            fmt::format("only {} has the lightning indexer", kDeepseekV32Architecture));
  }
  return ok_status();
}

// Keys DeepSeek does not take (norm type, Qwen's MoE layout) and the checkpoint dtype.
Status check_no_qwen_keys(const ModelConfig& c, std::string_view src) {
  const std::string_view arch = architecture_name(c.architecture);
  if (c.norm_type != NormType::kRms) {
    return bad_config_value(src, kNormTypeKey, std::string(norm_type_name(c.norm_type)),
                            fmt::format("must be \"rms\" for {}", arch));
  }
  if (!c.mlp_only_layers.empty() || c.decoder_sparse_step != 1 || c.shared_expert_intermediate_size != 0) {
    return invalid_argument(fmt::format(
        "{}: mlp_only_layers, decoder_sparse_step and shared_expert_intermediate_size are Qwen keys; {} uses "
        "first_k_dense_replace, moe_layer_freq and n_shared_experts",
        src, arch));
  }
  if (c.torch_dtype != DType::kBF16 && c.torch_dtype != DType::kF16 && c.torch_dtype != DType::kF32) {
    return bad_config_value(src, "torch_dtype", std::string(dtype_name(c.torch_dtype)),
                            "must be bfloat16, float16 or float32");
  }
  return ok_status();
}
}  // namespace

Status validate_deepseek_config(const ModelConfig& c, std::string_view src) {
  GB_RETURN_IF_ERROR(check_dense_widths(c, src));
  GB_RETURN_IF_ERROR(check_mla_widths(c, src));
  GB_RETURN_IF_ERROR(check_routing(c, src));
  GB_RETURN_IF_ERROR(check_yarn(c, src));
  GB_RETURN_IF_ERROR(check_indexer(c, src));
  return check_no_qwen_keys(c, src);
}

std::string deepseek_config_json(const ModelConfig& c, std::string_view torch_dtype) {
  const DeepseekConfig& d = c.deepseek;
  const bool v32 = c.architecture == Architecture::kDeepseekV32;
  nlohmann::ordered_json j;
  j["architectures"] = {std::string(architecture_name(c.architecture))};
  j["model_type"] = v32 ? "deepseek_v32" : "deepseek_v3";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["n_shared_experts"] = d.n_shared_experts;
  j["n_routed_experts"] = c.num_experts;
  j["routed_scaling_factor"] = d.routed_scaling_factor;
  j["kv_lora_rank"] = d.kv_lora_rank;
  if (d.q_lora_rank > 0) {
    j["q_lora_rank"] = d.q_lora_rank;
  } else {
    j["q_lora_rank"] = nullptr;
  }
  j["qk_rope_head_dim"] = d.qk_rope_head_dim;
  j["v_head_dim"] = d.v_head_dim;
  j["qk_nope_head_dim"] = d.qk_nope_head_dim;
  j["topk_method"] = "noaux_tc";
  j["n_group"] = d.n_group;
  j["topk_group"] = d.topk_group;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["moe_layer_freq"] = d.moe_layer_freq;
  j["first_k_dense_replace"] = d.first_k_dense_replace;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["scoring_func"] = "sigmoid";
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (d.yarn) {
    const YarnRopeScaling& s = d.rope_scaling;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", s.factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings},
                         {"beta_fast", s.beta_fast},
                         {"beta_slow", s.beta_slow},
                         {"mscale", s.mscale},
                         {"mscale_all_dim", s.mscale_all_dim}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["attention_bias"] = false;
  j["num_nextn_predict_layers"] = d.num_nextn_predict_layers;
  if (v32) {
    j["index_n_heads"] = d.index_n_heads;
    j["index_head_dim"] = d.index_head_dim;
    j["index_topk"] = d.index_topk;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = std::string(torch_dtype);
  return j.dump(2) + "\n";
}

}  // namespace genbridge::model::detail
