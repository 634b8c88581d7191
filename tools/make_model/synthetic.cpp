#include "tools/make_model/synthetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/tensor_store.h"

namespace genbridge::model {
namespace {

// One tensor to generate: values uniform in [center - half_width, center + half_width).
struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  double center = 0.0;
  double std = 0.0;
  bool f32 = false;  // written as F32 whatever the checkpoint's dtype (Qwen3.5's A_log and linear_attn.norm.weight)
  // > 0: an I64 table [rows, k] of k distinct ids in [0, id_limit) per row (DeepSeek-V4's tid2eid); center and
  // std are unused.
  int64_t id_limit = 0;
  // Router skew (apply_router_skew): element (row, set_column) of the tensor viewed as [rows, last dim] (a 1-D
  // tensor as [n, 1]) is set to set_values[row % size] instead of drawn. Empty: none.
  int64_t set_column = -1;
  std::vector<float> set_values;
};

// The dtype a planned tensor is written in, for a checkpoint of `dtype`.
DType plan_dtype(const TensorPlan& t, DType dtype) {
  if (t.id_limit > 0) return DType::kI64;
  return t.f32 ? DType::kF32 : dtype;
}

uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

// DeepSeek-V4 with DeepSeek's names, in the dtypes DeepSeek ships the bf16 parts: linears, embeddings and norms
// in the checkpoint's dtype (BF16 for presets); hyper-connection weights, attention sinks, compressor position
// biases and gate biases F32; tid2eid I64. The scales, and why each was chosen:
//   linears (wq_a, wkv, wo_a, wo_b, compressor and indexer projections, weights_proj, experts, shared experts,
//     the MTP layer's e_proj / h_proj): std 1/sqrt(fan_in), outputs about as large as their (normed) inputs.
//     q is rms-normalised per head without a weight, so kv_norm alone sets the logits' scale: kv_norm (and the
//     compressor's norm, whose entries join the same softmax) 2 + U(-0.2, 0.2) give q.k / sqrt(head_dim) a std of
//     ~2, attention peaked but not one-hot (an fp64 check of these weights, window only: the best key takes ~0.26
//     of a head's weight on average, entropy ~0.66 of uniform's; with weights ~1 it was 0.09 and 0.87).
//   wq_b, indexer wq_b: 1/sqrt(q_lora_rank): the indexer's queries have elements of std ~1, so its
//     relu(q.k) scores spread over the compressed entries.
//   compressor wgate: 1/sqrt(hidden_size): gate scores of std ~1; ape std 0.5: a slot bias a bit smaller than
//     the scores, so the pooling weights depend on both the token and its slot in the window.
//   attn_sink: std 1 around 0: exp(sink) is about one key's weight, which matters while the context is short
//     and fades as the window fills.
//   router (ffn.gate.weight): std 2/sqrt(hidden_size): logits of std ~2, so the sqrt(softplus) scores spread
//     from ~0.1 to ~2 and the top-k is clear for most tokens.
//   gate.bias: std 0.1: moves the selection among close scores without dominating the scores' spread.
//   tid2eid: num_experts_per_tok distinct ids per row, uniformly drawn: a fixed random table per seed.
//   hc_{attn,ffn}_fn, hc_head_fn: std 1/sqrt(hc_mult * hidden_size): the mixes fn . x / rms(x) have std ~1 and
//     differ per token; scale 1 +- 0.1 and base std 1 (F32) then make pre = sigmoid(.) ~0.2-0.8 and
//     post = 2 sigmoid(.) ~0.4-1.6 vary per token and stream, and comb's rows differ before the Sinkhorn
//     projection (which keeps the streams' mixture doubly stochastic, so they neither blow up nor vanish).
//   other norms (attn_norm, ffn_norm, q_norm, the indexer compressor's, final and MTP norms): 1 + U(-0.1, 0.1).
//   embed.weight: std 1; head.weight: std 1/sqrt(hidden_size), logits of std ~1.
//   The SwiGLU clamp (swiglu_limit 10) rarely binds at these scales (gate and up are O(1)), as in real models.
// The tid2eid tables come first: every shard then starts with its I64 tensors, which keeps each one 8-byte
// aligned (the F32 scale [3] and hc_head_scale [1] would misalign a later one).
std::vector<TensorPlan> plan_deepseek_v4(const ModelConfig& c) {
  const DeepseekV4Config& d = c.dsv4;
  std::vector<TensorPlan> plan;
  const int64_t h = c.hidden_size, nh = c.num_attention_heads, D = c.head_dim, n = d.hc_mult, E = c.num_experts;
  const double norm_std = 0.1 / std::sqrt(3.0);  // U(-0.1, 0.1)
  const auto proj = [](int64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); };
  const auto add = [&](std::string name, std::vector<int64_t> shape, double center, double std, bool f32 = false) {
    plan.push_back(TensorPlan{std::move(name), std::move(shape), center, std, f32});
  };
  for (int64_t l = 0; l < d.num_hash_layers; ++l) {
    plan.push_back(TensorPlan{.name = layer_tensor_name(l, "ffn.gate.tid2eid", ""),
                              .shape = {c.vocab_size, c.num_experts_per_tok},
                              .id_limit = E});
  }
  // fn, base and scale of a hyper-connection site (rows (2 + n) n, 3 scales) or of the streams' collapse (n, 1).
  const auto add_hc = [&](const std::string& prefix, int64_t rows, int64_t scales) {
    add(prefix + "fn", {rows, n * h}, 0.0, proj(n * h), true);
    add(prefix + "base", {rows}, 0.0, 1.0, true);
    add(prefix + "scale", {scales}, 1.0, 0.1 / std::sqrt(3.0), true);
  };
  const auto add_swiglu = [&](const std::string& prefix, int64_t inter) {
    add(prefix + "w1.weight", {inter, h}, 0.0, proj(h));
    add(prefix + "w2.weight", {h, inter}, 0.0, proj(inter));
    add(prefix + "w3.weight", {inter, h}, 0.0, proj(h));
  };
  const auto add_compressor = [&](const std::string& prefix, int64_t ratio, int64_t width, double norm_center) {
    const int64_t coff = ratio == 4 ? 2 : 1;
    add(prefix + "wkv.weight", {coff * width, h}, 0.0, proj(h));
    add(prefix + "wgate.weight", {coff * width, h}, 0.0, proj(h));
    add(prefix + "ape", {ratio, coff * width}, 0.0, 0.5, true);
    add(prefix + "norm.weight", {width}, norm_center, norm_center * norm_std);
  };
  // One block (a layer, or an MTP layer under mtp.<i>.) of compress ratio `ratio`; hash-routed or top-k.
  const auto add_block = [&](const std::string& p, int64_t ratio, bool hash) {
    add(p + "attn_norm.weight", {h}, 1.0, norm_std);
    add(p + "ffn_norm.weight", {h}, 1.0, norm_std);
    add_hc(p + "hc_attn_", (2 + n) * n, 3);
    add_hc(p + "hc_ffn_", (2 + n) * n, 3);
    add(p + "attn.wq_a.weight", {d.q_lora_rank, h}, 0.0, proj(h));
    add(p + "attn.q_norm.weight", {d.q_lora_rank}, 1.0, norm_std);
    add(p + "attn.wq_b.weight", {nh * D, d.q_lora_rank}, 0.0, proj(d.q_lora_rank));
    add(p + "attn.wkv.weight", {D, h}, 0.0, proj(h));
    add(p + "attn.kv_norm.weight", {D}, 2.0, 2 * norm_std);
    add(p + "attn.wo_a.weight", {d.o_groups * d.o_lora_rank, nh * D / d.o_groups}, 0.0, proj(nh * D / d.o_groups));
    add(p + "attn.wo_b.weight", {h, d.o_groups * d.o_lora_rank}, 0.0, proj(d.o_groups * d.o_lora_rank));
    add(p + "attn.attn_sink", {nh}, 0.0, 1.0, true);
    if (ratio > 0) add_compressor(p + "attn.compressor.", ratio, D, 2.0);
    if (ratio == 4) {
      add(p + "attn.indexer.wq_b.weight", {d.index_n_heads * d.index_head_dim, d.q_lora_rank}, 0.0,
          proj(d.q_lora_rank));
      add(p + "attn.indexer.weights_proj.weight", {d.index_n_heads, h}, 0.0, proj(h));
      add_compressor(p + "attn.indexer.compressor.", ratio, d.index_head_dim, 1.0);
    }
    add(p + "ffn.gate.weight", {E, h}, 0.0, 2.0 * proj(h));
    if (!hash) add(p + "ffn.gate.bias", {E}, 0.0, 0.1, true);
    for (int64_t e = 0; e < E; ++e) add_swiglu(fmt::format("{}ffn.experts.{}.", p, e), c.moe_intermediate_size);
    if (d.n_shared_experts > 0) add_swiglu(p + "ffn.shared_experts.", d.n_shared_experts * c.moe_intermediate_size);
  };
  add("embed.weight", {c.vocab_size, h}, 0.0, c.tie_word_embeddings ? proj(h) : 1.0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    add_block(layer_tensor_name(l, "", ""), d.compress_ratio(l), l < d.num_hash_layers);
  }
  add_hc("hc_head_", n, 1);
  add("norm.weight", {h}, 1.0, norm_std);
  if (!c.tie_word_embeddings) add("head.weight", {c.vocab_size, h}, 0.0, proj(h));
  // What DeepSeek's checkpoints also ship and genbridge ignores: the multi-token-prediction layers (top-k routed,
  // their ratio from compress_ratios' tail), each with its own input projections, norms and stream collapse.
  for (int64_t m = 0; m < d.num_nextn_predict_layers; ++m) {
    const std::string p = fmt::format("mtp.{}.", m);
    const size_t tail = static_cast<size_t>(c.num_hidden_layers + m);
    add_block(p, tail < d.compress_ratios.size() ? d.compress_ratios[tail] : 0, false);
    add(p + "e_proj.weight", {h, h}, 0.0, proj(h));
    add(p + "h_proj.weight", {h, h}, 0.0, proj(h));
    add(p + "enorm.weight", {h}, 1.0, norm_std);
    add(p + "hnorm.weight", {h}, 1.0, norm_std);
    add(p + "norm.weight", {h}, 1.0, norm_std);
    add_hc(p + "hc_head_", n, 1);
  }
  return plan;
}

std::vector<TensorPlan> plan_tensors(const ModelConfig& c) {
  if (c.is_deepseek_v4()) return plan_deepseek_v4(c);
  std::vector<TensorPlan> plan;
  const int64_t h = c.hidden_size;
  const double norm_center = c.norm_type == NormType::kGemma ? 0.0 : 1.0;
  const double norm_std = 0.1 / std::sqrt(3.0);  // U(-0.1, 0.1)
  const auto proj = [](int64_t fan_in) { return 1.0 / std::sqrt(static_cast<double>(fan_in)); };
  const auto add = [&](std::string name, std::vector<int64_t> shape, double center, double std) {
    plan.push_back(TensorPlan{std::move(name), std::move(shape), center, std});
  };
  const auto add_mlp = [&](const std::string& prefix, int64_t inter) {
    add(prefix + "gate_proj.weight", {inter, h}, 0.0, proj(h));
    add(prefix + "up_proj.weight", {inter, h}, 0.0, proj(h));
    add(prefix + "down_proj.weight", {h, inter}, 0.0, proj(inter));
  };
  const std::string prefix = c.tensor_prefix();
  add(prefix + "embed_tokens.weight", {c.vocab_size, h}, 0.0, c.tie_word_embeddings ? proj(h) : 1.0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const auto name = [&](std::string_view s) { return layer_tensor_name(l, s, prefix); };
    if (c.is_qwen35()) {  // Gated DeltaNet or gated attention, then MoE with a gated shared expert
      const Qwen35Config& q = c.qwen35;
      add(name("input_layernorm.weight"), {h}, norm_center, norm_std);
      if (c.is_linear_layer(l)) {
        const int64_t C = q.conv_dim(), nv = q.linear_num_value_heads, K = q.linear_conv_kernel_dim;
        add(name("linear_attn.in_proj_qkv.weight"), {C, h}, 0.0, proj(h));
        add(name("linear_attn.in_proj_z.weight"), {q.value_dim(), h}, 0.0, proj(h));
        add(name("linear_attn.in_proj_b.weight"), {nv, h}, 0.0, proj(h));
        add(name("linear_attn.in_proj_a.weight"), {nv, h}, 0.0, proj(h));
        add(name("linear_attn.conv1d.weight"), {C, 1, K}, 0.0, proj(K));
        // dt_bias ~ 1 and A = exp(A_log) in [0.1, 2]: per-token decays exp(g) from ~0.1 to ~0.9, so the
        // recurrent state carries context over tens of tokens.
        add(name("linear_attn.dt_bias"), {nv}, 1.0, 0.2);
        add(name("linear_attn.A_log"), {nv}, -0.8, 1.5 / std::sqrt(3.0));
        plan.back().f32 = true;
        add(name("linear_attn.norm.weight"), {q.linear_value_head_dim}, 1.0, norm_std);
        plan.back().f32 = true;
        add(name("linear_attn.out_proj.weight"), {h, q.value_dim()}, 0.0, proj(q.value_dim()));
      } else {
        add(name("self_attn.q_proj.weight"), {c.q_proj_size(), h}, 0.0, proj(h));
        add(name("self_attn.k_proj.weight"), {c.kv_size(), h}, 0.0, proj(h));
        add(name("self_attn.v_proj.weight"), {c.kv_size(), h}, 0.0, proj(h));
        add(name("self_attn.o_proj.weight"), {h, c.q_size()}, 0.0, proj(c.q_size()));
        add(name("self_attn.q_norm.weight"), {c.head_dim}, norm_center, norm_std);
        add(name("self_attn.k_norm.weight"), {c.head_dim}, norm_center, norm_std);
      }
      add(name("post_attention_layernorm.weight"), {h}, norm_center, norm_std);
      add(name("mlp.gate.weight"), {c.num_experts, h}, 0.0, 2.0 * proj(h));
      const int64_t I = c.moe_intermediate_size;
      if (q.text_config) {  // the Hub's layout: fused experts (gate rows, then up rows, per expert)
        add(name("mlp.experts.gate_up_proj"), {c.num_experts, 2 * I, h}, 0.0, proj(h));
        add(name("mlp.experts.down_proj"), {c.num_experts, h, I}, 0.0, proj(I));
      } else {
        for (int64_t e = 0; e < c.num_experts; ++e) add_mlp(fmt::format("{}layers.{}.mlp.experts.{}.", prefix, l, e), I);
      }
      add_mlp(name("mlp.shared_expert."), c.shared_expert_intermediate_size);
      add(name("mlp.shared_expert_gate.weight"), {1, h}, 0.0, proj(h));
      continue;
    }
    if (c.is_deepseek()) {  // MLA [+ indexer], DeepSeek MoE (HF names and order)
      const DeepseekConfig& d = c.deepseek;
      const int64_t nh = c.num_attention_heads;
      add(name("input_layernorm.weight"), {h}, norm_center, norm_std);
      if (d.q_lora_rank > 0) {
        add(name("self_attn.q_a_proj.weight"), {d.q_lora_rank, h}, 0.0, proj(h));
        add(name("self_attn.q_a_layernorm.weight"), {d.q_lora_rank}, norm_center, norm_std);
        add(name("self_attn.q_b_proj.weight"), {nh * d.qk_head_dim(), d.q_lora_rank}, 0.0, proj(d.q_lora_rank));
      } else {
        add(name("self_attn.q_proj.weight"), {nh * d.qk_head_dim(), h}, 0.0, proj(h));
      }
      add(name("self_attn.kv_a_proj_with_mqa.weight"), {d.kv_lora_rank + d.qk_rope_head_dim, h}, 0.0, proj(h));
      add(name("self_attn.kv_a_layernorm.weight"), {d.kv_lora_rank}, norm_center, norm_std);
      add(name("self_attn.kv_b_proj.weight"), {nh * (d.qk_nope_head_dim + d.v_head_dim), d.kv_lora_rank}, 0.0,
          proj(d.kv_lora_rank));
      add(name("self_attn.o_proj.weight"), {h, nh * d.v_head_dim}, 0.0, proj(nh * d.v_head_dim));
      if (c.has_indexer()) {
        add(name("self_attn.indexer.wq_b.weight"), {d.index_n_heads * d.index_head_dim, d.q_lora_rank}, 0.0,
            proj(d.q_lora_rank));
        add(name("self_attn.indexer.wk.weight"), {d.index_head_dim, h}, 0.0, proj(h));
        add(name("self_attn.indexer.k_norm.weight"), {d.index_head_dim}, 1.0, norm_std);
        add(name("self_attn.indexer.k_norm.bias"), {d.index_head_dim}, 0.0, norm_std);
        add(name("self_attn.indexer.weights_proj.weight"), {d.index_n_heads, h}, 0.0, proj(h));
      }
      add(name("post_attention_layernorm.weight"), {h}, norm_center, norm_std);
      if (c.is_moe_layer(l)) {
        add(name("mlp.gate.weight"), {c.num_experts, h}, 0.0, 2.0 * proj(h));
        // Sigmoid scores live in (0, 1): a bias of std 0.05 moves selection without dominating it.
        add(name("mlp.gate.e_score_correction_bias"), {c.num_experts}, 0.0, 0.05);
        for (int64_t e = 0; e < c.num_experts; ++e) {
          add_mlp(fmt::format("model.layers.{}.mlp.experts.{}.", l, e), c.moe_intermediate_size);
        }
        if (d.n_shared_experts > 0) add_mlp(name("mlp.shared_experts."), d.n_shared_experts * c.moe_intermediate_size);
      } else {
        add_mlp(name("mlp."), c.intermediate_size);
      }
      continue;
    }
    add(name("input_layernorm.weight"), {h}, norm_center, norm_std);
    add(name("self_attn.q_proj.weight"), {c.q_size(), h}, 0.0, proj(h));
    add(name("self_attn.k_proj.weight"), {c.kv_size(), h}, 0.0, proj(h));
    add(name("self_attn.v_proj.weight"), {c.kv_size(), h}, 0.0, proj(h));
    add(name("self_attn.o_proj.weight"), {h, c.q_size()}, 0.0, proj(c.q_size()));
    add(name("self_attn.q_norm.weight"), {c.head_dim}, norm_center, norm_std);
    add(name("self_attn.k_norm.weight"), {c.head_dim}, norm_center, norm_std);
    add(name("post_attention_layernorm.weight"), {h}, norm_center, norm_std);
    if (c.is_moe_layer(l)) {
      add(name("mlp.gate.weight"), {c.num_experts, h}, 0.0, 2.0 * proj(h));
      for (int64_t e = 0; e < c.num_experts; ++e) {
        add_mlp(fmt::format("model.layers.{}.mlp.experts.{}.", l, e), c.moe_intermediate_size);
      }
      if (c.has_shared_expert()) {
        add_mlp(name("mlp.shared_expert."), c.shared_expert_intermediate_size);
        add(name("mlp.shared_expert_gate.weight"), {1, h}, 0.0, proj(h));
      }
    } else {
      add_mlp(name("mlp."), c.intermediate_size);
    }
  }
  add(prefix + "norm.weight", {h}, norm_center, norm_std);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, h}, 0.0, proj(h));
  if (c.is_qwen35() && c.qwen35.text_config) {
    // What the Hub's checkpoints also ship and text serving ignores: a (token) vision tower and the MTP head.
    add("model.visual.patch_embed.proj.weight", {h, 3 * 2 * 16 * 16}, 0.0, proj(3 * 2 * 16 * 16));
    for (int64_t m = 0; m < c.qwen35.mtp_num_hidden_layers; ++m) {
      add(fmt::format("mtp.layers.{}.input_layernorm.weight", m), {h}, norm_center, norm_std);
    }
    if (c.qwen35.mtp_num_hidden_layers > 0) add("mtp.fc.weight", {h, 2 * h}, 0.0, proj(2 * h));
  }
  return plan;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Fills `out` (numel elements of `dtype`) for one tensor. Element i depends only on (seed, name, i).
void generate(const TensorPlan& t, uint64_t seed, DType dtype, std::vector<std::byte>& out) {
  dtype = plan_dtype(t, dtype);
  const int64_t n = numel(t.shape);
  out.resize(static_cast<size_t>(n) * dtype_size(dtype));
  const uint64_t key = splitmix64(seed ^ splitmix64(fnv1a(t.name)));
  if (t.id_limit > 0) {
    // Row r: the first k entries of a Fisher-Yates shuffle of [0, id_limit) driven by (seed, name, r, j).
    const int64_t rows = t.shape[0], k = t.shape[1], limit = t.id_limit;
    int64_t* ids = reinterpret_cast<int64_t*>(out.data());
    parallel_for(rows, limit, [&](int64_t b, int64_t e) {
      std::vector<int64_t> perm(static_cast<size_t>(limit));
      for (int64_t r = b; r < e; ++r) {
        for (int64_t i = 0; i < limit; ++i) perm[static_cast<size_t>(i)] = i;
        for (int64_t j = 0; j < k; ++j) {
          const uint64_t x = splitmix64(key + static_cast<uint64_t>(r * k + j + 1) * 0x9e3779b97f4a7c15ull);
          const int64_t pick = j + static_cast<int64_t>(x % static_cast<uint64_t>(limit - j));
          std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
          ids[r * k + j] = perm[static_cast<size_t>(j)];
        }
      }
    });
    return;
  }
  const double half_width = std::sqrt(3.0) * t.std;  // sqrt is correctly rounded: same on every machine
  const int64_t cols = t.shape.size() == 1 ? 1 : t.shape.back();
  std::byte* dst = out.data();
  parallel_for(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint64_t r = splitmix64(key + static_cast<uint64_t>(i + 1) * 0x9e3779b97f4a7c15ull);
      const double u = static_cast<double>(r >> 11) * 0x1.0p-52 - 1.0;  // exact, in [-1, 1)
      float v = static_cast<float>(t.center + u * half_width);
      if (!t.set_values.empty() && i % cols == t.set_column) v = t.set_values[static_cast<size_t>(i / cols) % t.set_values.size()];
      switch (dtype) {
        case DType::kBF16:
          reinterpret_cast<bf16_t*>(dst)[i] = float_to_bf16(v);
          break;
        case DType::kF16:
          reinterpret_cast<fp16_t*>(dst)[i] = float_to_fp16(v);
          break;
        default:
          reinterpret_cast<float*>(dst)[i] = v;
          break;
      }
    }
  });
}

Status write_text_file(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return invalid_argument(fmt::format("{}: cannot create", tmp.string()));
    out << text;
    out.flush();
    if (!out) return internal_error(fmt::format("{}: write failed", tmp.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return internal_error(fmt::format("{}: cannot rename into place: {}", path.string(), ec.message()));
  return ok_status();
}

struct Preset {
  std::string_view name;
  ModelConfig config;
};

// The widths every preset chooses for itself.
struct Dims {
  int64_t vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
      max_position_embeddings, num_experts, num_experts_per_tok, moe_intermediate_size, intermediate_size;
};

void set_dims(const Dims& d, ModelConfig* c) {
  c->vocab_size = d.vocab_size;
  c->hidden_size = d.hidden_size;
  c->num_hidden_layers = d.num_hidden_layers;
  c->num_attention_heads = d.num_attention_heads;
  c->num_key_value_heads = d.num_key_value_heads;
  c->head_dim = d.head_dim;
  c->max_position_embeddings = d.max_position_embeddings;
  c->num_experts = d.num_experts;
  c->num_experts_per_tok = d.num_experts_per_tok;
  c->moe_intermediate_size = d.moe_intermediate_size;
  c->intermediate_size = d.intermediate_size;
}

// A Qwen3-MoE model: every layer MoE, bf16, untied embeddings, top-k renormalised.
ModelConfig qwen3_moe(const Dims& d) {
  ModelConfig c;
  set_dims(d, &c);
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.norm_topk_prob = true;
  c.decoder_sparse_step = 1;
  c.tie_word_embeddings = false;
  c.shared_expert_intermediate_size = 0;
  c.torch_dtype = DType::kBF16;
  return c;
}

ModelConfig tiny_preset() {
  ModelConfig tiny = qwen3_moe({.vocab_size = 512,
                                .hidden_size = 128,
                                .num_hidden_layers = 4,
                                .num_attention_heads = 4,
                                .num_key_value_heads = 2,
                                .head_dim = 64,
                                .max_position_embeddings = 4096,
                                .num_experts = 8,
                                .num_experts_per_tok = 2,
                                .moe_intermediate_size = 64,
                                .intermediate_size = 256});
  tiny.mlp_only_layers = {1};
  tiny.shared_expert_intermediate_size = 128;
  tiny.norm_type = NormType::kRms;
  return tiny;
}

ModelConfig tiny_gemma_preset() {
  ModelConfig gemma = tiny_preset();  // layers 1 and 3 MoE (sparse step 2), 0 and 2 dense
  gemma.norm_type = NormType::kGemma;
  gemma.tie_word_embeddings = true;
  gemma.shared_expert_intermediate_size = 0;
  gemma.norm_topk_prob = false;
  gemma.decoder_sparse_step = 2;
  gemma.mlp_only_layers = {};
  gemma.rope_theta = 10000.0;
  return gemma;
}

ModelConfig small_preset() {
  // intermediate_size: no dense layer uses it; kept so mlp_only_layers can be edited.
  return qwen3_moe({.vocab_size = 8192,
                    .hidden_size = 1024,
                    .num_hidden_layers = 8,
                    .num_attention_heads = 16,
                    .num_key_value_heads = 4,
                    .head_dim = 128,
                    .max_position_embeddings = 32768,
                    .num_experts = 32,
                    .num_experts_per_tok = 4,
                    .moe_intermediate_size = 512,
                    .intermediate_size = 3072});
}

// DeepSeek-V3.2 (MLA + DSA): dense first layer, grouped sigmoid routing with a correction bias, a shared
// expert, YaRN (original context 1024, so the ramp sits inside the rope dimensions), q_lora, and an
// index_topk of 64 so that sparse selection is exercised from 65 tokens of context on.
ModelConfig tiny_dsa_preset() {
  ModelConfig tiny_dsa;
  tiny_dsa.architecture = Architecture::kDeepseekV32;
  set_dims({.vocab_size = 512,
            .hidden_size = 128,
            .num_hidden_layers = 3,
            .num_attention_heads = 4,
            .num_key_value_heads = 4,
            .head_dim = 0,
            .max_position_embeddings = 4096,
            .num_experts = 16,
            .num_experts_per_tok = 4,
            .moe_intermediate_size = 64,
            .intermediate_size = 256},
           &tiny_dsa);
  tiny_dsa.rms_norm_eps = 1e-6;
  tiny_dsa.rope_theta = 10000.0;
  tiny_dsa.norm_topk_prob = true;
  tiny_dsa.tie_word_embeddings = false;
  tiny_dsa.torch_dtype = DType::kBF16;
  DeepseekConfig& td = tiny_dsa.deepseek;
  td.q_lora_rank = 96;
  td.kv_lora_rank = 128;
  td.qk_nope_head_dim = 64;
  td.qk_rope_head_dim = 64;
  td.v_head_dim = 64;
  td.n_shared_experts = 1;
  td.n_group = 4;
  td.topk_group = 2;
  td.routed_scaling_factor = 2.5;
  td.first_k_dense_replace = 1;
  td.moe_layer_freq = 1;
  td.yarn = true;
  td.rope_scaling = {.factor = 4.0,
                     .original_max_position_embeddings = 1024,
                     .beta_fast = 32.0,
                     .beta_slow = 1.0,
                     .mscale = 1.0,
                     .mscale_all_dim = 1.0};
  td.index_n_heads = 4;
  td.index_head_dim = 128;
  td.index_topk = 64;
  tiny_dsa.head_dim = td.qk_head_dim();
  return tiny_dsa;
}

ModelConfig tiny_dsv3_preset() {
  ModelConfig tiny_v3 = tiny_dsa_preset();  // DeepSeek-V3: no indexer
  tiny_v3.architecture = Architecture::kDeepseekV3;
  tiny_v3.deepseek.index_n_heads = tiny_v3.deepseek.index_head_dim = tiny_v3.deepseek.index_topk = 0;
  return tiny_v3;
}

ModelConfig tiny_dsv3_noq_preset() {
  ModelConfig tiny_v3_noq =
      tiny_dsv3_preset();  // V3 without q_lora (q_proj), no YaRN, every layer MoE, no shared expert
  tiny_v3_noq.deepseek.q_lora_rank = 0;
  tiny_v3_noq.deepseek.yarn = false;
  tiny_v3_noq.deepseek.rope_scaling = {};
  tiny_v3_noq.deepseek.first_k_dense_replace = 0;
  tiny_v3_noq.deepseek.n_shared_experts = 0;
  tiny_v3_noq.deepseek.n_group = 1;
  tiny_v3_noq.deepseek.topk_group = 1;
  tiny_v3_noq.norm_topk_prob = false;
  tiny_v3_noq.deepseek.routed_scaling_factor = 1.0;
  return tiny_v3_noq;
}

// The benchmark size of the DSA model: DeepSeek-V3.2's MLA and indexer widths (kv_lora_rank 512,
// rope 64, nope 128, v 128; 16 heads, 16 indexer heads of 128), ~0.42 GB in bf16.
ModelConfig small_dsa_preset() {
  ModelConfig small_dsa = tiny_dsa_preset();
  set_dims({.vocab_size = 8192,
            .hidden_size = 1024,
            .num_hidden_layers = 4,
            .num_attention_heads = 16,
            .num_key_value_heads = 16,
            .head_dim = 0,
            .max_position_embeddings = 163840,
            .num_experts = 32,
            .num_experts_per_tok = 4,
            .moe_intermediate_size = 512,
            .intermediate_size = 3072},
           &small_dsa);
  DeepseekConfig& sd = small_dsa.deepseek;
  sd.q_lora_rank = 384;
  sd.kv_lora_rank = 512;
  sd.qk_nope_head_dim = 128;
  sd.qk_rope_head_dim = 64;
  sd.v_head_dim = 128;
  sd.rope_scaling.original_max_position_embeddings = 4096;
  sd.rope_scaling.factor = 40.0;
  sd.index_n_heads = 16;
  sd.index_head_dim = 128;
  sd.index_topk = 256;
  small_dsa.head_dim = sd.qk_head_dim();
  return small_dsa;
}

// Qwen3.5-MoE as the Hub ships it (Qwen3_5MoeForConditionalGeneration: keys under text_config, tensors under
// model.language_model., fused experts, a vision tower and an MTP head that text serving ignores): Gated
// DeltaNet layers with full attention every second layer, partial rotary 0.25 with M-RoPE sections.
ModelConfig tiny_qwen35_preset() {
  ModelConfig c;
  c.architecture = Architecture::kQwen35Moe;
  set_dims({.vocab_size = 512,
            .hidden_size = 128,
            .num_hidden_layers = 4,
            .num_attention_heads = 4,
            .num_key_value_heads = 2,
            .head_dim = 64,
            .max_position_embeddings = 8192,
            .num_experts = 8,
            .num_experts_per_tok = 2,
            .moe_intermediate_size = 64,
            .intermediate_size = 0},
           &c);
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e7;
  c.norm_topk_prob = true;
  c.norm_type = NormType::kGemma;
  c.shared_expert_intermediate_size = 64;
  c.tie_word_embeddings = false;
  c.torch_dtype = DType::kBF16;
  Qwen35Config& q = c.qwen35;
  q.linear_layers = {true, false, true, false};
  q.linear_num_key_heads = 2;
  q.linear_num_value_heads = 4;
  q.linear_key_head_dim = 32;
  q.linear_value_head_dim = 32;
  q.linear_conv_kernel_dim = 4;
  q.partial_rotary_factor = 0.25;
  q.mrope_section = {3, 3, 2};
  q.mrope_interleaved = true;
  q.text_config = true;
  q.mtp_num_hidden_layers = 1;
  return c;
}

// The text-only class (Qwen3_5MoeForCausalLM: keys at the top level, tensors under model.) with one tensor per
// expert, as quantized derivatives ship them.
ModelConfig tiny_qwen35_split_preset() {
  ModelConfig c = tiny_qwen35_preset();
  c.qwen35.text_config = false;
  c.qwen35.mtp_num_hidden_layers = 0;
  return c;
}

// Sized like "small" (hidden 1024, 8 layers, 32 experts top-4 of width 512) with Qwen3.5's blocks at the real
// models' head widths: 6 Gated DeltaNet layers (8 key / 16 value heads of 128) and 2 full-attention layers
// (8 / 2 heads of 256, rotary 64), so its speed compares with small's.
ModelConfig small_qwen35_preset() {
  ModelConfig c = tiny_qwen35_preset();
  set_dims({.vocab_size = 8192,
            .hidden_size = 1024,
            .num_hidden_layers = 8,
            .num_attention_heads = 8,
            .num_key_value_heads = 2,
            .head_dim = 256,
            .max_position_embeddings = 32768,
            .num_experts = 32,
            .num_experts_per_tok = 4,
            .moe_intermediate_size = 512,
            .intermediate_size = 0},
           &c);
  c.shared_expert_intermediate_size = 512;
  Qwen35Config& q = c.qwen35;
  q.linear_layers = {true, true, true, false, true, true, true, false};
  q.linear_num_key_heads = 8;
  q.linear_num_value_heads = 16;
  q.linear_key_head_dim = 128;
  q.linear_value_head_dim = 128;
  q.mrope_section = {11, 11, 10};
  return c;
}

// DeepSeek-V4 at the smallest widths that keep its structure (DeepSeek's names and dtypes, plan_deepseek_v4):
// one layer of each attention kind plus a second compressed-sparse one (compress_ratios [0, 4, 128, 4], the
// MTP layer's 0 after them), heads of DeepSeek's 512 (448 + 64 rope) over one shared KV head, the grouped
// output projection, the indexer at its real head width with index_topk 16 (sparse selection from 68 tokens
// on), YaRN on the compressed layers, a hash-routed first layer, the SwiGLU clamp, 4 hyper-connection streams,
// and one MTP layer whose mtp.0.* tensors the loader counts and ignores.
ModelConfig tiny_dsv4_preset() {
  ModelConfig c;
  c.architecture = Architecture::kDeepseekV4;
  set_dims({.vocab_size = 512,
            .hidden_size = 128,
            .num_hidden_layers = 4,
            .num_attention_heads = 4,
            .num_key_value_heads = 1,
            .head_dim = 512,
            .max_position_embeddings = 65536,
            .num_experts = 8,
            .num_experts_per_tok = 2,
            .moe_intermediate_size = 64,
            .intermediate_size = 0},
           &c);
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.norm_topk_prob = true;
  c.tie_word_embeddings = false;
  c.torch_dtype = DType::kBF16;
  DeepseekV4Config& d = c.dsv4;
  d.compress_ratios = {0, 4, 128, 4, 0};
  d.q_lora_rank = 64;
  d.qk_rope_head_dim = 64;
  d.o_groups = 2;
  d.o_lora_rank = 64;
  d.sliding_window = 128;
  d.compress_rope_theta = 160000.0;
  d.yarn = true;
  d.rope_scaling.factor = 16.0;
  d.rope_scaling.original_max_position_embeddings = 65536;
  d.rope_scaling.beta_fast = 32.0;
  d.rope_scaling.beta_slow = 1.0;
  d.index_n_heads = 4;
  d.index_head_dim = 128;
  d.index_topk = 16;
  d.n_shared_experts = 1;
  d.routed_scaling_factor = 1.5;
  d.num_hash_layers = 1;
  d.swiglu_limit = 10.0;
  d.hc_mult = 4;
  d.hc_sinkhorn_iters = 20;
  d.hc_eps = 1e-6;
  d.num_nextn_predict_layers = 1;
  return c;
}

// Sized like "small" (hidden 1024, 8 layers, 32 experts top-4 of width 512, vocab 8192) for speed comparisons,
// with DeepSeek-V4's blocks: two sliding-window layers then compressed-sparse and heavily-compressed ones in
// turn (as V4-Flash starts), 8 heads x 512, q_lora_rank 384, 4 output groups of 256, the indexer 16 x 128 with
// index_topk 64; ~1.09 GB in bf16, 0.12 GB of it the MTP layer the loader skips.
ModelConfig small_dsv4_preset() {
  ModelConfig c = tiny_dsv4_preset();
  set_dims({.vocab_size = 8192,
            .hidden_size = 1024,
            .num_hidden_layers = 8,
            .num_attention_heads = 8,
            .num_key_value_heads = 1,
            .head_dim = 512,
            .max_position_embeddings = 65536,
            .num_experts = 32,
            .num_experts_per_tok = 4,
            .moe_intermediate_size = 512,
            .intermediate_size = 0},
           &c);
  DeepseekV4Config& d = c.dsv4;
  d.compress_ratios = {0, 0, 4, 128, 4, 128, 4, 128, 0};
  d.q_lora_rank = 384;
  d.o_groups = 4;
  d.o_lora_rank = 256;
  d.index_n_heads = 16;
  d.index_head_dim = 128;
  d.index_topk = 64;
  return c;
}

std::vector<Preset> presets() {
  return {{"tiny", tiny_preset()},
          {"tiny-gemma", tiny_gemma_preset()},
          {"small", small_preset()},
          {"tiny-dsa", tiny_dsa_preset()},
          {"tiny-dsv3", tiny_dsv3_preset()},
          {"tiny-dsv3-noq", tiny_dsv3_noq_preset()},
          {"small-dsa", small_dsa_preset()},
          {"tiny-qwen35", tiny_qwen35_preset()},
          {"tiny-qwen35-split", tiny_qwen35_split_preset()},
          {"small-qwen35", small_qwen35_preset()},
          {"tiny-dsv4", tiny_dsv4_preset()},
          {"small-dsv4", small_dsv4_preset()}};
}

// "model-<digits>-of-<digits>.safetensors"
bool is_shard_file_name(std::string_view f) {
  const auto digits = [&](size_t& i) {
    const size_t start = i;
    while (i < f.size() && f[i] >= '0' && f[i] <= '9') ++i;
    return i > start;
  };
  const auto literal = [&](size_t& i, std::string_view s) {
    if (f.substr(i, s.size()) != s) return false;
    i += s.size();
    return true;
  };
  size_t i = 0;
  return literal(i, "model-") && digits(i) && literal(i, "-of-") && digits(i) && literal(i, ".safetensors") &&
         i == f.size();
}

// The router skew (see write_synthetic_checkpoint): each MoE layer's experts ranked by a seeded hash of
// (layer, expert); the expert of rank r gets a selection bias of skew / (r + 1). Qwen routers have no bias, so
// the bias rides on a constant feature: column 0 of the embedding is kSkewFeature for every token, and column 0
// of router row e is bias_e / kSkewFeature (the router sees that feature through the residual stream and the
// post-attention norm, so the logit moves by about the bias). DeepSeek routers carry it in their selection bias
// (e_score_correction_bias; V4's gate.bias; V4's hash-routed layers have none).
constexpr float kSkewFeature = 4.0f;

void apply_router_skew(const ModelConfig& c, uint64_t seed, double skew, std::vector<TensorPlan>& plan) {
  if (skew == 0.0) return;
  const int64_t E = c.num_experts;
  const auto biases = [&](int64_t layer, float scale) {
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
    const auto key = [&](int64_t e) { return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(layer * E + e + 1))); };
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
    std::vector<float> out(static_cast<size_t>(E));
    for (int64_t r = 0; r < E; ++r) out[static_cast<size_t>(order[static_cast<size_t>(r)])] =
        static_cast<float>(skew / static_cast<double>(r + 1)) * scale;
    return out;
  };
  const auto layer_of = [](const std::string& name) -> int64_t {
    const size_t p = name.find("layers.");
    return p == std::string::npos ? -1 : std::atoll(name.c_str() + p + 7);
  };
  const bool deepseek = c.is_deepseek() || c.is_deepseek_v4();
  for (TensorPlan& t : plan) {
    const std::string& n = t.name;
    if (!deepseek && (n.ends_with("embed_tokens.weight"))) {
      t.set_column = 0;
      t.set_values = {kSkewFeature};
    } else if (!deepseek && n.ends_with("mlp.gate.weight")) {
      t.set_column = 0;
      t.set_values = biases(layer_of(n), 1.0f / kSkewFeature);
    } else if (deepseek && (n.ends_with("mlp.gate.e_score_correction_bias") || n.ends_with("ffn.gate.bias"))) {
      t.set_column = 0;
      t.set_values = biases(layer_of(n), 1.0f);
    }
  }
}

Status write_checkpoint(const ModelConfig& config, std::string_view label, uint64_t seed,
                        const std::filesystem::path& out_dir, int shards, DType dtype, double router_skew) {
  const std::string dir = out_dir.string();
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32) {
    return invalid_argument(
        fmt::format("write_synthetic_checkpoint: dtype {} is not bf16, f16 or f32", dtype_name(dtype)));
  }
  ModelConfig c = config;
  c.torch_dtype = dtype;
  GB_RETURN_IF_ERROR(validate_model_config(c, "write_synthetic_checkpoint config"));
  if (!(router_skew >= 0.0 && router_skew <= kMaxRouterSkew)) {
    return invalid_argument(
        fmt::format("write_synthetic_checkpoint: router skew {} must be in 0..{}", router_skew, kMaxRouterSkew));
  }
  std::vector<TensorPlan> plan = plan_tensors(c);
  apply_router_skew(c, seed, router_skew, plan);
  if (shards < 1 || static_cast<size_t>(shards) > plan.size() || shards > 99999) {
    return invalid_argument(
        fmt::format("write_synthetic_checkpoint: shards = {} must be between 1 and the number "
                    "of tensors ({})",
                    shards, plan.size()));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return invalid_argument(fmt::format("{}: cannot create the directory: {}", dir, ec.message()));
  // Replace an earlier checkpoint: a stale index or shard would otherwise shadow or join the new files.
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string f = entry.path().filename().string();
    if (f == kConfigFileName || f == kSingleFileName || f == kIndexFileName || is_shard_file_name(f)) {
      std::filesystem::remove(entry.path(), ec);
      if (ec)
        return internal_error(fmt::format("{}: cannot remove the old file: {}", entry.path().string(), ec.message()));
    }
  }

  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"genbridge_preset", std::string(label)}, {"genbridge_seed", std::to_string(seed)}};
  if (router_skew != 0.0) metadata["genbridge_router_skew"] = fmt::format("{}", router_skew);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total_bytes = 0;
  std::vector<std::byte> buffer;
  // Tensors go to shards in order, an equal count per shard (tensor i -> shard i * shards / count).
  size_t next = 0;
  for (int s = 0; s < shards; ++s) {
    const size_t end = (static_cast<size_t>(s) + 1) * plan.size() / static_cast<size_t>(shards);
    const std::string file = shards == 1 ? std::string(kSingleFileName) : shard_file_name(s + 1, shards);
    std::vector<SafetensorsTensorSpec> specs;
    for (size_t i = next; i < end; ++i) specs.push_back({plan[i].name, plan_dtype(plan[i], dtype), plan[i].shape});
    GB_ASSIGN_OR_RETURN(SafetensorsWriter w, SafetensorsWriter::create(out_dir / file, std::move(specs), metadata));
    for (size_t i = next; i < end; ++i) {
      generate(plan[i], seed, dtype, buffer);
      GB_RETURN_IF_ERROR(w.write_next(buffer.data(), buffer.size()));
      weight_map[plan[i].name] = file;
      total_bytes += buffer.size();
    }
    GB_RETURN_IF_ERROR(w.finish());
    next = end;
  }
  if (shards > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = weight_map;
    GB_RETURN_IF_ERROR(write_text_file(out_dir / kIndexFileName, index.dump(2) + "\n"));
  }
  return write_text_file(out_dir / kConfigFileName, to_config_json(c));
}

}  // namespace

std::vector<std::string> synthetic_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : presets()) names.emplace_back(p.name);
  return names;
}

Result<ModelConfig> synthetic_preset_config(std::string_view preset) {
  for (const Preset& p : presets()) {
    if (p.name == preset) return p.config;
  }
  std::string known;
  for (const Preset& p : presets()) known += (known.empty() ? "" : ", ") + std::string(p.name);
  return invalid_argument(fmt::format("unknown synthetic model preset '{}' (known presets: {})", preset, known));
}

Status write_synthetic_checkpoint(std::string_view preset, uint64_t seed, const std::filesystem::path& out_dir,
                                  int shards, double router_skew) {
  GB_ASSIGN_OR_RETURN(ModelConfig config, synthetic_preset_config(preset));
  return write_checkpoint(config, preset, seed, out_dir, shards, DType::kBF16, router_skew);
}

Status write_synthetic_checkpoint(const ModelConfig& config, uint64_t seed, const std::filesystem::path& out_dir,
                                  int shards, DType dtype, double router_skew) {
  return write_checkpoint(config, "custom", seed, out_dir, shards, dtype, router_skew);
}

uint64_t model_weight_bytes(const ModelConfig& config, DType dtype) {
  uint64_t n = 0;
  for (const TensorPlan& t : plan_tensors(config)) {
    n += static_cast<uint64_t>(numel(t.shape)) * dtype_size(plan_dtype(t, dtype));
  }
  return n;
}

}  // namespace genbridge::model
