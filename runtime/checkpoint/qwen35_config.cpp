// The Qwen3.5-MoE keys of config.json (Hugging Face's qwen3_5_moe / qwen3_5_moe_text): every key the forward
// pass reads checked at load, every feature it does not implement refused naming its key.
#include "runtime/checkpoint/qwen35_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

namespace genbridge::model::detail {
namespace {

using json = nlohmann::json;

// rope_parameters (HF's newer form) or the legacy top-level rope_theta / partial_rotary_factor / rope_scaling.
Status parse_rope(const ConfigReader& r, ModelConfig* c) {
  Qwen35Config& q = c->qwen35;
  if (const json* rs = r.find("rope_scaling")) {
    return r.bad("rope_scaling", *rs, "must be null (Qwen3.5 configures RoPE in rope_parameters)");
  }
  const json* rp = r.find("rope_parameters");
  if (!rp) {
    GB_RETURN_IF_ERROR(r.get_double("rope_theta", true, &c->rope_theta));
    return r.get_double("partial_rotary_factor", false, &q.partial_rotary_factor);
  }
  if (!rp->is_object()) return r.bad("rope_parameters", *rp, "must be an object");
  const ConfigReader p(*rp, r.source());
  if (const json* t = p.find("rope_type"); t && !(t->is_string() && t->get<std::string>() == "default")) {
    return r.bad("rope_parameters.rope_type", *t, "must be \"default\" (RoPE scaling is not supported)");
  }
  for (const auto& [key, value] : rp->items()) {
    static constexpr std::string_view kKnown[] = {"rope_type", "rope_theta", "partial_rotary_factor", "mrope_section",
                                                  "mrope_interleaved"};
    if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown)) {
      return r.bad(fmt::format("rope_parameters.{}", key), value,
                   "is not a key genbridge reads (rope_type, rope_theta, partial_rotary_factor, mrope_section, "
                   "mrope_interleaved)");
    }
  }
  const auto get_d = [&](const char* key, bool required, double* out) -> Status {
    const json* v = p.find(key);
    if (!v) {
      if (required && !r.has(key)) return r.missing(fmt::format("rope_parameters.{}", key));
      return r.get_double(key, false, out);  // the legacy top-level key, when present
    }
    if (!v->is_number()) return r.bad(fmt::format("rope_parameters.{}", key), *v, "must be a number");
    *out = v->get<double>();
    return ok_status();
  };
  GB_RETURN_IF_ERROR(get_d("rope_theta", true, &c->rope_theta));
  GB_RETURN_IF_ERROR(get_d("partial_rotary_factor", false, &q.partial_rotary_factor));
  if (const json* ms = p.find("mrope_section")) {
    if (!ms->is_array() || ms->empty()) {
      return r.bad("rope_parameters.mrope_section", *ms, "must be a list of positive section sizes");
    }
    for (const json& e : *ms) {
      if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > kMaxConfigSize) {
        return r.bad("rope_parameters.mrope_section", *ms, "must be a list of positive section sizes");
      }
      q.mrope_section.push_back(e.get<int64_t>());
    }
  }
  if (const json* mi = p.find("mrope_interleaved")) {
    if (!mi->is_boolean()) return r.bad("rope_parameters.mrope_interleaved", *mi, "must be true or false");
    q.mrope_interleaved = mi->get<bool>();
  }
  return ok_status();
}

// layer_types, or full_attention_interval when the list is absent (HF's rule).
Status parse_layer_types(const ConfigReader& r, ModelConfig* c) {
  Qwen35Config& q = c->qwen35;
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array()) return r.bad("layer_types", *lt, "must be a list of \"linear_attention\" / \"full_attention\"");
    for (const json& e : *lt) {
      const std::string s = e.is_string() ? e.get<std::string>() : "";
      if (s != "linear_attention" && s != "full_attention") {
        return r.bad("layer_types", e, "each entry must be \"linear_attention\" or \"full_attention\"");
      }
      q.linear_layers.push_back(s == "linear_attention");
    }
    return ok_status();
  }
  int64_t interval = 4;
  GB_RETURN_IF_ERROR(r.get_int("full_attention_interval", false, &interval));
  if (interval < 1 || interval > kMaxConfigSize) {
    return bad_config_value(r.source(), "full_attention_interval", std::to_string(interval),
                            "must be a positive integer (layer i is full attention iff (i + 1) % interval == 0)");
  }
  if (c->num_hidden_layers < 1 || c->num_hidden_layers > kMaxConfigSize) return ok_status();  // validated later
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) q.linear_layers.push_back((l + 1) % interval != 0);
  return ok_status();
}

}  // namespace

Status parse_qwen35_config(const ConfigReader& top, ModelConfig* c) {
  // The Hub's Qwen3_5MoeForConditionalGeneration nests the language model under text_config; the text-only
  // class (Qwen3_5MoeForCausalLM) has the keys at the top level.
  const json* text = top.find("text_config");
  if (text && !text->is_object()) return top.bad("text_config", *text, "must be an object (the language model's keys)");
  c->qwen35.text_config = text != nullptr;
  const ConfigReader r = text ? ConfigReader(*text, top.source(), "text_config.") : top;
  // (The top level's model_type is parse_model_config's to check; this is text_config's.)
  if (const json* mt = text ? r.find("model_type") : nullptr;
      mt && !(mt->is_string() && (mt->get<std::string>() == "qwen3_5_moe_text" || mt->get<std::string>() == "qwen3_5_moe"))) {
    return r.bad("model_type", *mt, "must be \"qwen3_5_moe_text\" (or \"qwen3_5_moe\")");
  }
  if (const json* v = r.find("attention_bias"); v && !(v->is_boolean() && !v->get<bool>())) {
    return r.bad("attention_bias", *v, "must be false (attention projection biases are not supported)");
  }
  if (const json* v = r.find("hidden_act"); v && !(v->is_string() && v->get<std::string>() == "silu")) {
    return r.bad("hidden_act", *v, "must be \"silu\" (experts are SwiGLU)");
  }
  if (const json* v = r.find("attn_output_gate"); v && !(v->is_boolean() && v->get<bool>())) {
    return r.bad("attn_output_gate", *v, "must be true (Qwen3.5's full attention gates its output)");
  }
  if (const json* v = r.find("norm_topk_prob"); v && !(v->is_boolean() && v->get<bool>())) {
    return r.bad("norm_topk_prob", *v, "must be true (Qwen3.5 renormalises the top-k router weights)");
  }
  if (const json* v = r.find("mamba_ssm_dtype"); v && !(v->is_string() && v->get<std::string>() == "float32")) {
    return r.bad("mamba_ssm_dtype", *v,
               "must be \"float32\" (the recurrent state's dtype is the DeviceOperator's state contract: fp32)");
  }
  // Qwen3.5-MoE deleted the dense-layer keys (every layer is MoE): a value that would make a layer dense is
  // refused (intermediate_size sizes nothing and is ignored).
  if (const json* v = r.find("decoder_sparse_step"); v && !(v->is_number_integer() && v->get<int64_t>() == 1)) {
    return r.bad("decoder_sparse_step", *v, "Qwen3.5-MoE has no dense layers (every layer is MoE)");
  }
  if (const json* v = r.find("mlp_only_layers"); v && !(v->is_array() && v->empty())) {
    return r.bad("mlp_only_layers", *v, "Qwen3.5-MoE has no dense layers (every layer is MoE)");
  }
  for (const ConfigReader* level : {&top, &r}) {
    if (const json* v = level->find(kNormTypeKey)) {
      return level->bad(kNormTypeKey, *v,
                        "Qwen3.5 uses Gemma norms as its own; the key is a test knob for Qwen3-MoE checkpoints");
    }
  }
  GB_RETURN_IF_ERROR(r.get_int("vocab_size", true, &c->vocab_size));
  GB_RETURN_IF_ERROR(r.get_int("hidden_size", true, &c->hidden_size));
  GB_RETURN_IF_ERROR(r.get_int("num_hidden_layers", true, &c->num_hidden_layers));
  GB_RETURN_IF_ERROR(r.get_int("num_attention_heads", true, &c->num_attention_heads));
  GB_RETURN_IF_ERROR(r.get_int("num_key_value_heads", true, &c->num_key_value_heads));
  GB_RETURN_IF_ERROR(r.get_int("head_dim", true, &c->head_dim));
  GB_RETURN_IF_ERROR(r.get_double("rms_norm_eps", true, &c->rms_norm_eps));
  GB_RETURN_IF_ERROR(r.get_int("max_position_embeddings", false, &c->max_position_embeddings));
  GB_RETURN_IF_ERROR(r.get_int("num_experts", true, &c->num_experts));
  GB_RETURN_IF_ERROR(r.get_int("num_experts_per_tok", true, &c->num_experts_per_tok));
  GB_RETURN_IF_ERROR(r.get_int("moe_intermediate_size", true, &c->moe_intermediate_size));
  GB_RETURN_IF_ERROR(r.get_int("shared_expert_intermediate_size", true, &c->shared_expert_intermediate_size));
  Qwen35Config& q = c->qwen35;
  GB_RETURN_IF_ERROR(r.get_int("linear_num_key_heads", true, &q.linear_num_key_heads));
  GB_RETURN_IF_ERROR(r.get_int("linear_num_value_heads", true, &q.linear_num_value_heads));
  GB_RETURN_IF_ERROR(r.get_int("linear_key_head_dim", true, &q.linear_key_head_dim));
  GB_RETURN_IF_ERROR(r.get_int("linear_value_head_dim", true, &q.linear_value_head_dim));
  GB_RETURN_IF_ERROR(r.get_int("linear_conv_kernel_dim", true, &q.linear_conv_kernel_dim));
  GB_RETURN_IF_ERROR(r.get_int("mtp_num_hidden_layers", false, &q.mtp_num_hidden_layers));
  GB_RETURN_IF_ERROR(parse_rope(r, c));
  GB_RETURN_IF_ERROR(parse_layer_types(r, c));
  // tie_word_embeddings may sit at either level (the top level wins, as in HF's composite config).
  GB_RETURN_IF_ERROR(r.get_bool("tie_word_embeddings", &c->tie_word_embeddings));
  if (text) GB_RETURN_IF_ERROR(top.get_bool("tie_word_embeddings", &c->tie_word_embeddings));
  c->norm_topk_prob = true;
  c->norm_type = NormType::kGemma;
  c->decoder_sparse_step = 1;
  return ok_status();
}

Status validate_qwen35_config(const ModelConfig& c, std::string_view src) {
  const Qwen35Config& q = c.qwen35;
  const std::string p = q.text_config ? "text_config." : "";
  const auto bad = [&](std::string_view k, const std::string& v, std::string_view rule) {
    return bad_config_value(src, p + std::string(k), v, rule);
  };
  if (c.norm_type != NormType::kGemma) return bad("norm", "rms", "Qwen3.5's norms are Gemma norms (1 + w)");
  if (c.num_experts < 1) return bad("num_experts", std::to_string(c.num_experts), "must be positive (every layer is MoE)");
  if (!c.has_shared_expert()) {
    return bad("shared_expert_intermediate_size", std::to_string(c.shared_expert_intermediate_size),
               "must be positive (every Qwen3.5 MoE layer has a gated shared expert)");
  }
  if (!c.norm_topk_prob) return bad("norm_topk_prob", "false", "must be true");
  if (c.decoder_sparse_step != 1 || !c.mlp_only_layers.empty()) {
    return bad("decoder_sparse_step", std::to_string(c.decoder_sparse_step), "every Qwen3.5 layer is MoE");
  }
  for (const auto& [k, v] : {std::pair<const char*, int64_t>{"linear_num_key_heads", q.linear_num_key_heads},
                             {"linear_num_value_heads", q.linear_num_value_heads},
                             {"linear_key_head_dim", q.linear_key_head_dim},
                             {"linear_value_head_dim", q.linear_value_head_dim}}) {
    GB_RETURN_IF_ERROR(check_config_size(src, p + k, v, 1));
  }
  if (q.linear_num_value_heads % q.linear_num_key_heads != 0) {
    return bad("linear_num_value_heads", std::to_string(q.linear_num_value_heads),
               fmt::format("must be a multiple of linear_num_key_heads ({}): value heads are grouped per key head",
                           q.linear_num_key_heads));
  }
  if (q.linear_conv_kernel_dim < 2 || q.linear_conv_kernel_dim > 8) {
    return bad("linear_conv_kernel_dim", std::to_string(q.linear_conv_kernel_dim),
               "must be between 2 and 8 (the causal conv1d kernels genbridge implements)");
  }
  if (q.conv_dim() > kMaxConfigSize) {
    return bad("linear_num_value_heads", std::to_string(q.linear_num_value_heads),
               fmt::format("in_proj_qkv's width 2 * nk * dk + nv * dv = {} exceeds {}", q.conv_dim(), kMaxConfigSize));
  }
  if (static_cast<int64_t>(q.linear_layers.size()) != c.num_hidden_layers) {
    return bad("layer_types", fmt::format("a list of {}", q.linear_layers.size()),
               fmt::format("must have one entry per layer (num_hidden_layers = {})", c.num_hidden_layers));
  }
  if (c.num_kv_layers() == 0) {
    return bad("layer_types", "no \"full_attention\" entry",
               "at least one layer must be full attention (a model of linear-attention layers only is not supported)");
  }
  if (!(q.partial_rotary_factor > 0.0 && q.partial_rotary_factor <= 1.0)) {
    return bad("partial_rotary_factor", fmt::format("{}", q.partial_rotary_factor), "must be in (0, 1]");
  }
  const double rot = static_cast<double>(c.head_dim) * q.partial_rotary_factor;
  if (rot != std::floor(rot) || static_cast<int64_t>(rot) % 2 != 0) {
    return bad("partial_rotary_factor", fmt::format("{}", q.partial_rotary_factor),
               fmt::format("head_dim ({}) * partial_rotary_factor = {} must be an even whole number of dims", c.head_dim,
                           rot));
  }
  if (!q.mrope_section.empty()) {
    int64_t sum = 0;
    for (int64_t s : q.mrope_section) sum += s;
    if (sum * 2 != c.rotary_dim()) {
      return bad("rope_parameters.mrope_section", int_list_text(q.mrope_section),
                 fmt::format("the sections must cover the rotary dims' {} frequencies (sum {}): genbridge serves text, "
                             "whose three position ids are equal, which reduces M-RoPE to 1-D RoPE only then",
                             c.rotary_dim() / 2, sum));
    }
  }
  if (q.mtp_num_hidden_layers < 0 || q.mtp_num_hidden_layers > kMaxConfigSize) {
    return bad("mtp_num_hidden_layers", std::to_string(q.mtp_num_hidden_layers), "must be a non-negative integer");
  }
  return ok_status();
}

std::string qwen35_config_json(const ModelConfig& c, std::string_view torch_dtype) {
  const Qwen35Config& q = c.qwen35;
  nlohmann::ordered_json t;
  t["model_type"] = "qwen3_5_moe_text";
  t["vocab_size"] = c.vocab_size;
  t["hidden_size"] = c.hidden_size;
  t["num_hidden_layers"] = c.num_hidden_layers;
  t["num_attention_heads"] = c.num_attention_heads;
  t["num_key_value_heads"] = c.num_key_value_heads;
  t["head_dim"] = c.head_dim;
  t["hidden_act"] = "silu";
  t["attention_bias"] = false;
  t["attn_output_gate"] = true;
  t["rms_norm_eps"] = c.rms_norm_eps;
  nlohmann::ordered_json rope;
  rope["rope_type"] = "default";
  rope["rope_theta"] = c.rope_theta;
  rope["partial_rotary_factor"] = q.partial_rotary_factor;
  if (!q.mrope_section.empty()) {
    rope["mrope_section"] = q.mrope_section;
    rope["mrope_interleaved"] = q.mrope_interleaved;
  }
  t["rope_parameters"] = rope;
  t["max_position_embeddings"] = c.max_position_embeddings;
  std::vector<std::string> types;
  for (bool linear : q.linear_layers) types.emplace_back(linear ? "linear_attention" : "full_attention");
  t["layer_types"] = types;
  t["linear_num_key_heads"] = q.linear_num_key_heads;
  t["linear_num_value_heads"] = q.linear_num_value_heads;
  t["linear_key_head_dim"] = q.linear_key_head_dim;
  t["linear_value_head_dim"] = q.linear_value_head_dim;
  t["linear_conv_kernel_dim"] = q.linear_conv_kernel_dim;
  t["num_experts"] = c.num_experts;
  t["num_experts_per_tok"] = c.num_experts_per_tok;
  t["moe_intermediate_size"] = c.moe_intermediate_size;
  t["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
  t["mamba_ssm_dtype"] = "float32";
  t["mtp_num_hidden_layers"] = q.mtp_num_hidden_layers;
  t["tie_word_embeddings"] = c.tie_word_embeddings;
  t["dtype"] = std::string(torch_dtype);
  nlohmann::ordered_json j;
  if (!q.text_config) {
    j["architectures"] = {std::string(kQwen35MoeTextArchitecture)};
    for (auto& [k, v] : t.items()) j[k] = v;
    return j.dump(2) + "\n";
  }
  j["architectures"] = {std::string(kQwen35MoeArchitecture)};
  j["model_type"] = "qwen3_5_moe";
  j["text_config"] = t;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  return j.dump(2) + "\n";
}

bool is_ignored_qwen35_tensor(const ModelConfig& c, std::string_view name) {
  if (!c.is_qwen35()) return false;
  return name.starts_with("model.visual.") || name.starts_with("mtp.");
}

}  // namespace genbridge::model::detail
