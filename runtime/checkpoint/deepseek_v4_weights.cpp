#include "runtime/checkpoint/deepseek_v4_weights.h"

#include <fmt/format.h>

#include <charconv>

namespace genbridge::model::detail {
namespace {

// One hyper-connection site (hc_attn / hc_ffn) of layer `l`: fn [(2 + n) n, n hidden], base [(2 + n) n],
// scale [3], all F32.
Status bind_hc_site(const ModelConfig& c, const V4TensorBinder& b, const std::string& prefix,
                    HyperConnectionWeights* hc) {
  const int64_t n = c.dsv4.hc_mult, mix = (2 + n) * n;
  const std::string why = fmt::format("hc_mult = {} (manifold-constrained hyper-connections)", n);
  GB_ASSIGN_OR_RETURN(hc->fn, b.bind_f32(prefix + "fn", {mix, n * c.hidden_size},
                                         "[(2 + hc_mult) * hc_mult, hc_mult * hidden_size]", why));
  GB_ASSIGN_OR_RETURN(hc->base, b.bind_f32(prefix + "base", {mix}, "[(2 + hc_mult) * hc_mult]", why));
  GB_ASSIGN_OR_RETURN(hc->scale, b.bind_f32(prefix + "scale", {3}, "[3]", why));
  return ok_status();
}

// A compressor (attn.compressor.* or attn.indexer.compressor.*) of ratio `ratio` over width `width`
// (`width_key` in config terms): two projections of coff * width rows (coff = 2 with the ratio-4 overlap),
// the F32 position bias ape [ratio, coff * width] and the norm [width].
Status bind_compressor(const ModelConfig& c, const V4TensorBinder& b, const std::string& prefix, int64_t ratio,
                       int64_t width, std::string_view width_key, std::string_view why, V4CompressorWeights* w) {
  const int64_t coff = ratio == 4 ? 2 : 1;
  const std::string rows = fmt::format("{}{}", coff == 2 ? "2 * " : "", width_key);
  const std::string proj_rule = fmt::format("[{}, hidden_size]", rows);
  GB_ASSIGN_OR_RETURN(w->wkv, b.bind(prefix + "wkv.weight", {coff * width, c.hidden_size}, proj_rule, why));
  GB_ASSIGN_OR_RETURN(w->wgate, b.bind(prefix + "wgate.weight", {coff * width, c.hidden_size}, proj_rule, why));
  GB_ASSIGN_OR_RETURN(w->ape,
                      b.bind_f32(prefix + "ape", {ratio, coff * width}, fmt::format("[{}, {}]", ratio, rows), why));
  GB_ASSIGN_OR_RETURN(w->norm, b.bind(prefix + "norm.weight", {width}, fmt::format("[{}]", width_key), why));
  return ok_status();
}

// SwiGLU weights w1 (gate), w3 (up), w2 (down) under `prefix`, of width `inter` (`inter_key`).
Result<MlpWeights> bind_swiglu(const ModelConfig& c, const V4TensorBinder& b, const std::string& prefix, int64_t inter,
                               std::string_view inter_key, std::string_view why) {
  const int64_t h = c.hidden_size;
  const std::string io = fmt::format("[{}, hidden_size]", inter_key);
  MlpWeights m;
  GB_ASSIGN_OR_RETURN(m.gate_proj, b.bind(prefix + "w1.weight", {inter, h}, io, why));
  GB_ASSIGN_OR_RETURN(m.up_proj, b.bind(prefix + "w3.weight", {inter, h}, io, why));
  GB_ASSIGN_OR_RETURN(m.down_proj,
                      b.bind(prefix + "w2.weight", {h, inter}, fmt::format("[hidden_size, {}]", inter_key), why));
  return m;
}

Status bind_attention(const ModelConfig& c, const V4TensorBinder& b, int64_t l, V4AttentionWeights* a) {
  const DeepseekV4Config& d = c.dsv4;
  const int64_t h = c.hidden_size, nh = c.num_attention_heads, D = c.head_dim;
  const auto name = [&](std::string_view s) { return layer_tensor_name(l, s, ""); };
  const std::string why = fmt::format("num_hidden_layers = {}", c.num_hidden_layers);
  GB_ASSIGN_OR_RETURN(a->wq_a, b.bind(name("attn.wq_a.weight"), {d.q_lora_rank, h}, "[q_lora_rank, hidden_size]", why));
  GB_ASSIGN_OR_RETURN(a->q_norm, b.bind(name("attn.q_norm.weight"), {d.q_lora_rank}, "[q_lora_rank]", why));
  GB_ASSIGN_OR_RETURN(a->wq_b, b.bind(name("attn.wq_b.weight"), {nh * D, d.q_lora_rank},
                                      "[num_attention_heads * head_dim, q_lora_rank]", why));
  GB_ASSIGN_OR_RETURN(a->wkv, b.bind(name("attn.wkv.weight"), {D, h}, "[head_dim, hidden_size]", why));
  GB_ASSIGN_OR_RETURN(a->kv_norm, b.bind(name("attn.kv_norm.weight"), {D}, "[head_dim]", why));
  GB_ASSIGN_OR_RETURN(a->wo_a, b.bind(name("attn.wo_a.weight"), {d.o_groups * d.o_lora_rank, nh * D / d.o_groups},
                                      "[o_groups * o_lora_rank, num_attention_heads * head_dim / o_groups]", why));
  GB_ASSIGN_OR_RETURN(a->wo_b, b.bind(name("attn.wo_b.weight"), {h, d.o_groups * d.o_lora_rank},
                                      "[hidden_size, o_groups * o_lora_rank]", why));
  GB_ASSIGN_OR_RETURN(a->attn_sink, b.bind_f32(name("attn.attn_sink"), {nh}, "[num_attention_heads]", why));
  const int64_t ratio = d.compress_ratio(l);
  if (ratio == 0) return ok_status();
  const std::string why_c = fmt::format("compress_ratios[{}] = {}", l, ratio);
  GB_RETURN_IF_ERROR(bind_compressor(c, b, name("attn.compressor."), ratio, D, "head_dim", why_c, &a->compressor));
  if (d.attention_kind(l) != V4AttentionKind::kCompressedSparse) return ok_status();
  const std::string why_i = fmt::format("compress_ratios[{}] = 4 (the lightning indexer)", l);
  GB_ASSIGN_OR_RETURN(a->index_wq_b,
                      b.bind(name("attn.indexer.wq_b.weight"), {d.index_n_heads * d.index_head_dim, d.q_lora_rank},
                             "[index_n_heads * index_head_dim, q_lora_rank]", why_i));
  GB_ASSIGN_OR_RETURN(a->index_weights_proj, b.bind(name("attn.indexer.weights_proj.weight"), {d.index_n_heads, h},
                                                    "[index_n_heads, hidden_size]", why_i));
  return bind_compressor(c, b, name("attn.indexer.compressor."), ratio, d.index_head_dim, "index_head_dim", why_i,
                         &a->index_compressor);
}

Status bind_moe(const ModelConfig& c, const V4TensorBinder& b, int64_t l, LayerWeights* lw) {
  const DeepseekV4Config& d = c.dsv4;
  const int64_t E = c.num_experts;
  const auto name = [&](std::string_view s) { return layer_tensor_name(l, s, ""); };
  const std::string why = fmt::format("layer {} is an MoE layer with n_routed_experts = {}", l, E);
  lw->is_moe = true;
  GB_ASSIGN_OR_RETURN(lw->moe.router,
                      b.bind(name("ffn.gate.weight"), {E, c.hidden_size}, "[n_routed_experts, hidden_size]", why));
  if (l < d.num_hash_layers) {
    GB_ASSIGN_OR_RETURN(
        lw->tid2eid,
        b.bind_ids(name("ffn.gate.tid2eid"), {c.vocab_size, c.num_experts_per_tok}, "[vocab_size, num_experts_per_tok]",
                   fmt::format("num_hash_layers = {}: layer {} routes by token id", d.num_hash_layers, l), E,
                   fmt::format("n_routed_experts = {}", E)));
  } else {
    GB_ASSIGN_OR_RETURN(
        lw->moe.e_score_correction_bias,
        b.bind_f32(name("ffn.gate.bias"), {E}, "[n_routed_experts]",
                   fmt::format("layer {} routes by top-k (num_hash_layers = {})", l, d.num_hash_layers)));
  }
  for (int64_t e = 0; e < E; ++e) {
    GB_ASSIGN_OR_RETURN(MlpWeights m, bind_swiglu(c, b, name(fmt::format("ffn.experts.{}.", e)),
                                                  c.moe_intermediate_size, "moe_intermediate_size", why));
    lw->moe.experts.push_back(m);
  }
  if (d.n_shared_experts > 0) {
    GB_ASSIGN_OR_RETURN(lw->moe.shared_expert,
                        bind_swiglu(c, b, name("ffn.shared_experts."), d.n_shared_experts * c.moe_intermediate_size,
                                    "n_shared_experts * moe_intermediate_size",
                                    fmt::format("n_shared_experts = {}", d.n_shared_experts)));
  }
  return ok_status();
}

}  // namespace

Status bind_deepseek_v4_weights(const ModelConfig& c, const V4TensorBinder& b, ModelWeights* w) {
  const int64_t h = c.hidden_size, n = c.dsv4.hc_mult;
  GB_ASSIGN_OR_RETURN(w->embed_tokens,
                      b.bind("embed.weight", {c.vocab_size, h}, "[vocab_size, hidden_size]", "the token embedding"));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights lw;
    const auto name = [&](std::string_view s) { return layer_tensor_name(l, s, ""); };
    const std::string why = fmt::format("num_hidden_layers = {}", c.num_hidden_layers);
    GB_ASSIGN_OR_RETURN(lw.input_layernorm, b.bind(name("attn_norm.weight"), {h}, "[hidden_size]", why));
    GB_ASSIGN_OR_RETURN(lw.post_attention_layernorm, b.bind(name("ffn_norm.weight"), {h}, "[hidden_size]", why));
    GB_RETURN_IF_ERROR(bind_hc_site(c, b, name("hc_attn_"), &lw.hc_attn));
    GB_RETURN_IF_ERROR(bind_hc_site(c, b, name("hc_ffn_"), &lw.hc_ffn));
    GB_RETURN_IF_ERROR(bind_attention(c, b, l, &lw.v4));
    GB_RETURN_IF_ERROR(bind_moe(c, b, l, &lw));
    w->layers.push_back(std::move(lw));
  }
  const std::string why_head = fmt::format("hc_mult = {} (the streams' collapse before the final norm)", n);
  GB_ASSIGN_OR_RETURN(w->hc_head.fn,
                      b.bind_f32("hc_head_fn", {n, n * h}, "[hc_mult, hc_mult * hidden_size]", why_head));
  GB_ASSIGN_OR_RETURN(w->hc_head.base, b.bind_f32("hc_head_base", {n}, "[hc_mult]", why_head));
  GB_ASSIGN_OR_RETURN(w->hc_head.scale, b.bind_f32("hc_head_scale", {1}, "[1]", why_head));
  GB_ASSIGN_OR_RETURN(w->final_norm, b.bind("norm.weight", {h}, "[hidden_size]", "the final norm"));
  if (c.tie_word_embeddings) {
    w->lm_head = w->embed_tokens;
  } else {
    GB_ASSIGN_OR_RETURN(w->lm_head, b.bind("head.weight", {c.vocab_size, h}, "[vocab_size, hidden_size]",
                                           "tie_word_embeddings is false"));
  }
  return ok_status();
}

bool is_ignored_deepseek_v4_tensor(const ModelConfig& c, std::string_view name) {
  if (!c.is_deepseek_v4() || c.dsv4.num_nextn_predict_layers == 0) return false;
  constexpr std::string_view kPrefix = "mtp.";
  if (!name.starts_with(kPrefix)) return false;
  name.remove_prefix(kPrefix.size());
  int64_t layer = -1;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), layer);
  if (ec != std::errc() || end == name.data() + name.size() || *end != '.') return false;
  return layer >= 0 && layer < c.dsv4.num_nextn_predict_layers;
}

}  // namespace genbridge::model::detail
