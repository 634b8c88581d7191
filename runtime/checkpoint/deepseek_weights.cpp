#include "runtime/checkpoint/deepseek_weights.h"

#include <fmt/format.h>

#include <charconv>

namespace genbridge::model::detail {

Status bind_deepseek_layer(const ModelConfig& c, int64_t l, const TensorBindFn& bind, LayerWeights* lw) {
  const DeepseekConfig& d = c.deepseek;
  const int64_t h = c.hidden_size, nh = c.num_attention_heads;
  const auto name = [&](std::string_view s) { return layer_tensor_name(l, s); };
  const std::string why = fmt::format("num_hidden_layers = {}", c.num_hidden_layers);
  const auto b = [&](std::string_view suffix, std::vector<int64_t> shape, std::string_view rule,
                     std::string_view reason,
                     bool keep = false) { return bind(name(suffix), std::move(shape), rule, reason, keep); };
  MlaWeights& a = lw->mla;
  if (d.q_lora_rank > 0) {
    const std::string why_q = fmt::format("q_lora_rank = {}", d.q_lora_rank);
    GB_ASSIGN_OR_RETURN(a.q_a_proj,
                        b("self_attn.q_a_proj.weight", {d.q_lora_rank, h}, "[q_lora_rank, hidden_size]", why_q));
    GB_ASSIGN_OR_RETURN(a.q_a_layernorm, b("self_attn.q_a_layernorm.weight", {d.q_lora_rank}, "[q_lora_rank]", why_q));
    GB_ASSIGN_OR_RETURN(a.q_b_proj,
                        b("self_attn.q_b_proj.weight", {nh * d.qk_head_dim(), d.q_lora_rank},
                          "[num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim), q_lora_rank]", why_q));
  } else {
    GB_ASSIGN_OR_RETURN(a.q_proj, b("self_attn.q_proj.weight", {nh * d.qk_head_dim(), h},
                                    "[num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim), hidden_size]",
                                    "q_lora_rank is absent or null"));
  }
  GB_ASSIGN_OR_RETURN(a.kv_a_proj_with_mqa,
                      b("self_attn.kv_a_proj_with_mqa.weight", {d.kv_lora_rank + d.qk_rope_head_dim, h},
                        "[kv_lora_rank + qk_rope_head_dim, hidden_size]", why));
  GB_ASSIGN_OR_RETURN(a.kv_a_layernorm, b("self_attn.kv_a_layernorm.weight", {d.kv_lora_rank}, "[kv_lora_rank]", why));
  GB_ASSIGN_OR_RETURN(a.kv_b_proj,
                      b("self_attn.kv_b_proj.weight", {nh * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank},
                        "[num_attention_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]", why));
  GB_ASSIGN_OR_RETURN(a.o_proj, b("self_attn.o_proj.weight", {h, nh * d.v_head_dim},
                                  "[hidden_size, num_attention_heads * v_head_dim]", why));
  if (c.has_indexer()) {
    const std::string why_i = fmt::format("{} has the lightning indexer", kDeepseekV32Architecture);
    IndexerWeights& x = lw->indexer;
    GB_ASSIGN_OR_RETURN(x.wq_b, b("self_attn.indexer.wq_b.weight", {d.index_n_heads * d.index_head_dim, d.q_lora_rank},
                                  "[index_n_heads * index_head_dim, q_lora_rank]", why_i));
    GB_ASSIGN_OR_RETURN(
        x.wk, b("self_attn.indexer.wk.weight", {d.index_head_dim, h}, "[index_head_dim, hidden_size]", why_i));
    GB_ASSIGN_OR_RETURN(x.k_norm, b("self_attn.indexer.k_norm.weight", {d.index_head_dim}, "[index_head_dim]", why_i));
    GB_ASSIGN_OR_RETURN(x.k_norm_bias,
                        b("self_attn.indexer.k_norm.bias", {d.index_head_dim}, "[index_head_dim]", why_i));
    GB_ASSIGN_OR_RETURN(x.weights_proj, b("self_attn.indexer.weights_proj.weight", {d.index_n_heads, h},
                                          "[index_n_heads, hidden_size]", why_i));
  }
  const auto mlp = [&](const std::string& prefix, int64_t inter, std::string_view inter_key,
                       std::string_view reason) -> Result<MlpWeights> {
    MlpWeights m;
    const std::string io = fmt::format("[{}, hidden_size]", inter_key);
    const std::string oi = fmt::format("[hidden_size, {}]", inter_key);
    GB_ASSIGN_OR_RETURN(m.gate_proj, bind(prefix + "gate_proj.weight", {inter, h}, io, reason, false));
    GB_ASSIGN_OR_RETURN(m.up_proj, bind(prefix + "up_proj.weight", {inter, h}, io, reason, false));
    GB_ASSIGN_OR_RETURN(m.down_proj, bind(prefix + "down_proj.weight", {h, inter}, oi, reason, false));
    return m;
  };
  lw->is_moe = c.is_moe_layer(l);
  if (!lw->is_moe) {
    const std::string why_dense = fmt::format("layer {} is dense (first_k_dense_replace = {}, moe_layer_freq = {})", l,
                                              d.first_k_dense_replace, d.moe_layer_freq);
    GB_ASSIGN_OR_RETURN(lw->dense, mlp(name("mlp."), c.intermediate_size, "intermediate_size", why_dense));
    return ok_status();
  }
  const std::string why_moe = fmt::format("layer {} is an MoE layer with n_routed_experts = {}", l, c.num_experts);
  GB_ASSIGN_OR_RETURN(lw->moe.router,
                      b("mlp.gate.weight", {c.num_experts, h}, "[n_routed_experts, hidden_size]", why_moe));
  GB_ASSIGN_OR_RETURN(lw->moe.e_score_correction_bias,
                      b("mlp.gate.e_score_correction_bias", {c.num_experts}, "[n_routed_experts]",
                        "scoring_func sigmoid with topk_method noaux_tc", /*keep=*/true));
  for (int64_t e = 0; e < c.num_experts; ++e) {
    GB_ASSIGN_OR_RETURN(MlpWeights m, mlp(fmt::format("model.layers.{}.mlp.experts.{}.", l, e), c.moe_intermediate_size,
                                          "moe_intermediate_size", why_moe));
    lw->moe.experts.push_back(m);
  }
  if (d.n_shared_experts > 0) {
    GB_ASSIGN_OR_RETURN(
        lw->moe.shared_expert,
        mlp(name("mlp.shared_experts."), d.n_shared_experts * c.moe_intermediate_size,
            "n_shared_experts * moe_intermediate_size", fmt::format("n_shared_experts = {}", d.n_shared_experts)));
  }
  return ok_status();
}

bool is_ignored_deepseek_tensor(const ModelConfig& c, std::string_view name) {
  if (!c.is_deepseek() || c.deepseek.num_nextn_predict_layers == 0) return false;
  constexpr std::string_view kPrefix = "model.layers.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return false;
  name.remove_prefix(kPrefix.size());
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
  if (ec != std::errc() || end == name.data() + name.size() || *end != '.') return false;
  return layer >= c.num_hidden_layers && layer < c.num_hidden_layers + c.deepseek.num_nextn_predict_layers;
}

}  // namespace genbridge::model::detail
