#include "runtime/forward/deepseek_attention.h"

#include <fmt/format.h>

#include <cmath>

#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "genbridge/ops/norm/layer_norm.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "runtime/forward/deepseek_rope.h"
#include "runtime/forward/quant_weights.h"

namespace genbridge::model {

// The LayerNorm epsilon of the indexer's k_norm (DeepSeek's reference code: LayerNorm(dim) with eps 1e-6).
inline constexpr float kIndexerKNormEps = 1e-6f;

runtime::KvModelShape kv_model_shape(const ModelConfig& c) {
  if (c.is_qwen35()) {  // KV for the full-attention layers, state for the Gated DeltaNet ones
    const Qwen35Config& q = c.qwen35;
    runtime::KvModelShape s{c.num_kv_layers(), c.num_key_value_heads, c.head_dim};
    s.state_layers = c.num_linear_layers();
    s.conv_kernel = q.linear_conv_kernel_dim;
    s.conv_channels = q.conv_dim();
    s.state_heads = q.linear_num_value_heads;
    s.state_key_dim = q.linear_key_head_dim;
    s.state_value_dim = q.linear_value_head_dim;
    return s;
  }
  if (c.is_deepseek_v4()) {  // window rings and compressor state in the slots, compressed entries in the pages
    const DeepseekV4Config& d = c.dsv4;
    runtime::KvModelShape s;
    s.num_layers = c.num_hidden_layers;
    s.sharedkv_dim = c.head_dim - d.qk_rope_head_dim;
    s.rope_dim = d.qk_rope_head_dim;
    s.sliding_window = d.sliding_window;
    s.compress_ratios.assign(d.compress_ratios.begin(), d.compress_ratios.begin() + c.num_hidden_layers);
    for (int64_t m : s.compress_ratios) {
      if (m == 4) s.index_head_dim = d.index_head_dim;
    }
    return s;
  }
  if (!c.is_deepseek()) return {c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
  runtime::KvModelShape s;
  s.num_layers = c.num_hidden_layers;
  s.kv_lora_rank = c.deepseek.kv_lora_rank;
  s.rope_dim = c.deepseek.qk_rope_head_dim;
  s.index_head_dim = c.has_indexer() ? c.deepseek.index_head_dim : 0;
  return s;
}

struct MlaAttention::Scratch {
  std::vector<bf16_t> qa, qr, kv, latent;
  std::vector<float> q, k_pe, q_latent, o_latent, iq, ik, iw, rstd;
  std::vector<bf16_t> o_v;
  std::vector<int32_t> topk;
  std::vector<float> cos, sin;
  int64_t max_tokens = 0;
};

std::shared_ptr<MlaAttention::Scratch> MlaAttention::make_scratch(int64_t max_tokens) const {
  const ModelConfig& c = config_;
  const DeepseekConfig& d = c.deepseek;
  const auto T = static_cast<size_t>(max_tokens), H = static_cast<size_t>(c.num_attention_heads);
  auto s = std::make_shared<Scratch>();
  s->max_tokens = max_tokens;
  s->qa.resize(T * std::max<int64_t>(1, d.q_lora_rank));
  s->qr.resize(T * std::max<int64_t>(1, d.q_lora_rank));
  s->kv.resize(T * (d.kv_lora_rank + d.qk_rope_head_dim));
  s->latent.resize(T * d.kv_lora_rank);
  s->q.resize(T * H * d.qk_head_dim());
  s->k_pe.resize(T * d.qk_rope_head_dim);
  s->q_latent.resize(T * H * d.kv_lora_rank);
  s->o_latent.resize(T * H * d.kv_lora_rank);
  s->o_v.resize(T * H * d.v_head_dim);
  s->rstd.resize(T);
  if (c.has_indexer()) {
    s->iq.resize(T * d.index_n_heads * d.index_head_dim);
    s->ik.resize(T * d.index_head_dim);
    s->iw.resize(T * d.index_n_heads);
    s->topk.resize(static_cast<size_t>(c.num_hidden_layers) * T * d.index_topk);  // every layer's, kept
  }
  s->cos.resize(T * d.qk_rope_head_dim / 2);
  s->sin.resize(T * d.qk_rope_head_dim / 2);
  return s;
}

bool MlaAttention::quantized_mla(int64_t layer) const {
  return quantized_ && layer < quantized_->num_layers() && quantized_->layer(layer).mla;
}

void mla_w_uk_t(const TensorView& kv_b, const DeepseekConfig& d, int64_t head, bf16_t* out) {
  // kv_b_proj rows [h (nope + v), h (nope + v) + nope) hold W_UK[h] [nope, kv_lora_rank].
  const auto* src = kv_b.data_as<const bf16_t>();
  for (int64_t i = 0; i < d.qk_nope_head_dim; ++i) {
    const bf16_t* row = src + (head * (d.qk_nope_head_dim + d.v_head_dim) + i) * kv_b.stride(0);
    for (int64_t r = 0; r < d.kv_lora_rank; ++r) out[r * d.qk_nope_head_dim + i] = row[r];
  }
}

TensorView mla_w_uv(const TensorView& kv_b, const DeepseekConfig& d, int64_t head) {
  const int64_t nope = d.qk_nope_head_dim, vd = d.v_head_dim;
  return TensorView::strided(
      const_cast<bf16_t*>(kv_b.data_as<const bf16_t>()) + (head * (nope + vd) + nope) * kv_b.stride(0), DType::kBF16,
      {vd, d.kv_lora_rank}, {kv_b.stride(0), 1});
}

Result<std::unique_ptr<MlaAttention>> MlaAttention::create(const Checkpoint& checkpoint,
                                                           const runtime::DeviceOperator& dev,
                                                           const runtime::KvPagePool& pool,
                                                           const QuantizedWeights* quantized) {
  std::unique_ptr<MlaAttention> m(new MlaAttention(checkpoint, dev));
  m->quantized_ = quantized;
  const ModelConfig& c = m->config_;
  const DeepseekConfig& d = c.deepseek;
  const runtime::KvModelShape shape = kv_model_shape(c);
  GB_RETURN_IF_ERROR(dev.check_kv_shape(shape));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    GB_ASSIGN_OR_RETURN(ops::MlaKvCache kv, dev.mla_layer_view(pool, shape, l));
    m->kv_.push_back(kv);
    if (c.has_indexer()) {
      GB_ASSIGN_OR_RETURN(ops::IndexerKeyCache keys, dev.indexer_layer_view(pool, shape, l));
      m->index_keys_.push_back(keys);
    }
    std::vector<std::unique_ptr<bf16_t[]>> heads;
    for (int64_t h = 0; !m->quantized_mla(l) && h < c.num_attention_heads; ++h) {
      std::unique_ptr<bf16_t[]> t(new bf16_t[static_cast<size_t>(d.kv_lora_rank * d.qk_nope_head_dim)]);
      mla_w_uk_t(m->w_.layers[l].mla.kv_b_proj, d, h, t.get());
      heads.push_back(std::move(t));
    }
    m->w_uk_t_.push_back(std::move(heads));
  }
  m->inv_freq_ = deepseek_rope_inv_freq(c);
  m->softmax_scale_ = static_cast<float>(mla_softmax_scale(c));
  if (c.has_indexer()) m->index_weight_scale_ = static_cast<float>(indexer_weight_scale(c));
  return m;
}

namespace {

Status ctx(Status s, const char* what) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("{}: {}", what, s.message()));
}

// Rotates the first 2 * half elements of rows x[j] (row stride `stride`) at the angles of token j / per
// (per rows, e.g. heads, share a token's angles): pairs (2i, 2i + 1) when interleaved, else (i, i + half).
void rotate_rows(float* x, int64_t rows, int64_t per, int64_t stride, int64_t half, const std::vector<float>& cos,
                 const std::vector<float>& sin, bool interleaved) {
  for (int64_t j = 0; j < rows; ++j) {
    float* v = x + j * stride;
    const float* c = cos.data() + (j / per) * half;
    const float* s = sin.data() + (j / per) * half;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + half;
      const float a = v[i0], b = v[i1];
      v[i0] = a * c[i] - b * s[i];
      v[i1] = b * c[i] + a * s[i];
    }
  }
}

}  // namespace

Status MlaAttention::forward(Scratch& s, int64_t layer, const TensorView& h, std::span<const int32_t> positions,
                             std::span<const int64_t> slots, const runtime::AttentionBatch& batch,
                             const TensorView& out) const {
  const ModelConfig& c = config_;
  const DeepseekConfig& d = c.deepseek;
  const MlaWeights& a = w_.layers[layer].mla;
  const QuantizedWeights::Layer* ql = quantized_mla(layer) ? &quantized_->layer(layer) : nullptr;
  // A projection: quant_linear with the layer's quantized weight when it holds them, else linear (bf16).
  auto proj = [ql](const TensorView& x, const TensorView& w, const ops::QuantWeight& qw, const TensorView& y) {
    return ql ? ops::quant_linear(x, qw, y) : ops::linear(x, w, y);
  };
  const int64_t T = h.dim(0), H = c.num_attention_heads, nope = d.qk_nope_head_dim, rope = d.qk_rope_head_dim;
  const int64_t qk = d.qk_head_dim(), r = d.kv_lora_rank, vd = d.v_head_dim, half = rope / 2;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const TensorView rstd(s.rstd.data(), DType::kF32, {T, 1});
  // RoPE angles of this batch's positions (fp64, rounded to fp32 once).
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[t]) * inv_freq_[i];
      s.cos[t * half + i] = static_cast<float>(std::cos(angle));
      s.sin[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
  // Queries: [T, H, nope | rope] fp32.
  const TensorView q(s.q.data(), DType::kF32, {T, H * qk});
  TensorView qr;
  if (d.q_lora_rank > 0) {
    const TensorView qa(s.qa.data(), DType::kBF16, {T, d.q_lora_rank});
    qr = TensorView(s.qr.data(), DType::kBF16, {T, d.q_lora_rank});
    GB_RETURN_IF_ERROR(ctx(proj(h, a.q_a_proj, ql ? ql->q_a_proj : ops::QuantWeight{}, qa), "q_a_proj"));
    GB_RETURN_IF_ERROR(ctx(ops::rms_norm(qa, a.q_a_layernorm, eps, qr, rstd), "q_a_layernorm"));
    GB_RETURN_IF_ERROR(ctx(proj(qr, a.q_b_proj, ql ? ql->q_b_proj : ops::QuantWeight{}, q), "q_b_proj"));
  } else {
    GB_RETURN_IF_ERROR(ctx(proj(h, a.q_proj, ql ? ql->q_proj : ops::QuantWeight{}, q), "q_proj"));
  }
  // Latent and shared rope key.
  const TensorView kv(s.kv.data(), DType::kBF16, {T, r + rope});
  GB_RETURN_IF_ERROR(
      ctx(proj(h, a.kv_a_proj_with_mqa, ql ? ql->kv_a_proj : ops::QuantWeight{}, kv), "kv_a_proj_with_mqa"));
  const TensorView latent(s.latent.data(), DType::kBF16, {T, r});
  GB_RETURN_IF_ERROR(ctx(ops::rms_norm(TensorView::strided(s.kv.data(), DType::kBF16, {T, r}, {r + rope, 1}),
                                       a.kv_a_layernorm, eps, latent, rstd),
                         "kv_a_layernorm"));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < rope; ++i) s.k_pe[t * rope + i] = bf16_to_float(s.kv[t * (r + rope) + r + i]);
  }
  rotate_rows(s.k_pe.data(), T, 1, rope, half, s.cos, s.sin, /*interleaved=*/true);
  rotate_rows(s.q.data() + nope, T * H, H, qk, half, s.cos, s.sin, /*interleaved=*/true);
  const TensorView k_pe(s.k_pe.data(), DType::kF32, {T, rope});
  GB_RETURN_IF_ERROR(ctx(dev_.write_mla_kv(kv_[layer], latent, k_pe, slots), "MLA KV write"));
  // Absorb W_UK: q_latent[t, h] = W_UK[h]^T q_nope[t, h].
  for (int64_t hh = 0; hh < H; ++hh) {
    const TensorView q_nope = TensorView::strided(s.q.data() + hh * qk, DType::kF32, {T, nope}, {H * qk, 1});
    const TensorView q_lat = TensorView::strided(s.q_latent.data() + hh * r, DType::kF32, {T, r}, {H * r, 1});
    if (ql) {
      GB_RETURN_IF_ERROR(ctx(ops::quant_linear(q_nope, ql->w_uk_t[hh], q_lat), "W_UK absorption"));
    } else {
      const TensorView w_uk_t(w_uk_t_[layer][hh].get(), DType::kBF16, {r, nope});
      GB_RETURN_IF_ERROR(ctx(ops::linear(q_nope, w_uk_t, q_lat), "W_UK absorption"));
    }
  }
  const TensorView q_latent(s.q_latent.data(), DType::kF32, {T, H, r});
  const TensorView q_rope = TensorView::strided(s.q.data() + nope, DType::kF32, {T, H, rope}, {H * qk, qk, 1});
  const TensorView o_latent(s.o_latent.data(), DType::kF32, {T, H, r});
  if (c.has_indexer()) {
    const int64_t ih = d.index_n_heads, id = d.index_head_dim;
    const TensorView iq(s.iq.data(), DType::kF32, {T, ih * id}), ik(s.ik.data(), DType::kF32, {T, id});
    GB_RETURN_IF_ERROR(ctx(ops::linear(qr, w_.layers[layer].indexer.wq_b, iq), "indexer wq_b"));
    GB_RETURN_IF_ERROR(ctx(ops::linear(h, w_.layers[layer].indexer.wk, ik), "indexer wk"));
    GB_RETURN_IF_ERROR(ctx(ops::layer_norm(ik, w_.layers[layer].indexer.k_norm, w_.layers[layer].indexer.k_norm_bias,
                                           kIndexerKNormEps, ik),
                           "indexer k_norm"));
    // Non-interleaved RoPE on the first qk_rope_head_dim dims of each indexer head and of the key.
    rotate_rows(s.iq.data(), T * ih, ih, id, half, s.cos, s.sin, /*interleaved=*/false);
    rotate_rows(s.ik.data(), T, 1, id, half, s.cos, s.sin, /*interleaved=*/false);
    GB_RETURN_IF_ERROR(ctx(dev_.write_indexer_keys(index_keys_[layer], ik, slots), "indexer key write"));
    const TensorView iw(s.iw.data(), DType::kF32, {T, ih});
    GB_RETURN_IF_ERROR(ctx(ops::linear(h, w_.layers[layer].indexer.weights_proj, iw), "indexer weights_proj"));
    for (int64_t i = 0; i < T * ih; ++i) s.iw[i] *= index_weight_scale_;
    const TensorView topk(s.topk.data() + layer * s.max_tokens * d.index_topk, DType::kI32, {T, d.index_topk});
    GB_RETURN_IF_ERROR(
        ctx(dev_.index_topk(TensorView(s.iq.data(), DType::kF32, {T, ih, id}), iw, index_keys_[layer], batch, topk),
            "indexer top-k"));
    GB_RETURN_IF_ERROR(ctx(dev_.sparse_attention(q_latent, q_rope, kv_[layer], topk, batch, softmax_scale_, o_latent),
                           "sparse MLA attention"));
  } else {
    GB_RETURN_IF_ERROR(
        ctx(dev_.mla_attention(q_latent, q_rope, kv_[layer], batch, softmax_scale_, o_latent), "MLA attention"));
  }
  // W_UV per head, then o_proj.
  for (int64_t hh = 0; hh < H; ++hh) {
    const TensorView ol = TensorView::strided(s.o_latent.data() + hh * r, DType::kF32, {T, r}, {H * r, 1});
    const TensorView ov = TensorView::strided(s.o_v.data() + hh * vd, DType::kBF16, {T, vd}, {H * vd, 1});
    GB_RETURN_IF_ERROR(ctx(proj(ol, mla_w_uv(a.kv_b_proj, d, hh), ql ? ql->w_uv[hh] : ops::QuantWeight{}, ov), "W_UV"));
  }
  return ctx(
      proj(TensorView(s.o_v.data(), DType::kBF16, {T, H * vd}), a.o_proj, ql ? ql->o_proj : ops::QuantWeight{}, out),
      "o_proj");
}

TensorView MlaAttention::index_selection(const Scratch& s, int64_t layer, int64_t num_tokens) const {
  if (!config_.has_indexer()) return TensorView();
  const int64_t k = config_.deepseek.index_topk;
  return TensorView(const_cast<int32_t*>(s.topk.data()) + layer * s.max_tokens * k, DType::kI32, {num_tokens, k});
}

}  // namespace genbridge::model
