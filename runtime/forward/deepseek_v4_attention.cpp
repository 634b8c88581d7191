#include "runtime/forward/deepseek_v4_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "genbridge/ops/attention/kv_compress.h"
#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "runtime/forward/deepseek_attention.h"
#include "runtime/forward/deepseek_rope.h"

namespace genbridge::model {

struct V4Attention::Scratch {
  int64_t max_tokens = 0, max_seqs = 0;
  // fp32 throughout the block: the only roundings are the cached rows' (the representation) and the output.
  std::vector<float> qa, qr, kvp, z;
  std::vector<float> q, qn, kv, attn, rstd;
  std::vector<float> cos, sin;  // [T, rope / 2] of the layer's rope
  // The forward's window: per sequence the ring rows before its first new token, then its new rows.
  std::vector<std::byte> win_main, win_scale, win_rope;
  std::vector<int32_t> window_slots, compressed_slots;
  std::vector<int64_t> win_base, new_slots;  // per sequence: its first scratch row; the new rows' scratch slots
  // Compressors: the forward's projections, the rows of the windows being pooled, the pooled entries.
  std::vector<float> ckv, cgate, rows, entries, normed, entry_cos, entry_sin;
  std::vector<int64_t> entry_slots;
  // Indexer: queries and weights of every token, compacted ones of the tokens with visible entries, the
  // per-query batch, the selection (as the generation's top-k contract gives it), and per layer the entries.
  std::vector<float> iq, iw, iq_c, iw_c;
  std::vector<int32_t> i_tables, i_ctx, i_qsl, i_rows, i_topk, selection;
  std::vector<int32_t> page_block;  // scratch: a page's block index in the current sequence's table
};

namespace {

Status ctx(Status s, const char* what) {
  if (s.ok()) return s;
  return Status(s.code(), fmt::format("{}: {}", what, s.message()));
}

// RoPE angles of positions[i] into cos/sin [n, half] (fp64 angle, rounded to fp32 once).
void angles(std::span<const int64_t> positions, const std::vector<double>& inv, std::vector<float>& cos,
            std::vector<float>& sin) {
  const size_t half = inv.size();
  cos.resize(positions.size() * half);
  sin.resize(positions.size() * half);
  for (size_t t = 0; t < positions.size(); ++t) {
    for (size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(positions[t]) * inv[i];
      cos[t * half + i] = static_cast<float>(std::cos(a));
      sin[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

// Rotates the trailing 2 * half elements of `rows` rows of width `width` (row stride `stride`); rows j * per ..
// (j + 1) * per - 1 share the angles of row j of cos/sin. `inverse` rotates by -angle (sin negated).
void rotate_trailing(float* x, int64_t rows, int64_t per, int64_t stride, int64_t width, const std::vector<float>& cos,
                     const std::vector<float>& sin, int64_t half, bool inverse) {
  for (int64_t j = 0; j < rows; ++j) {
    float* v = x + j * stride + width - 2 * half;
    const float* c = cos.data() + (j / per) * half;
    const float* s = sin.data() + (j / per) * half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[2 * i], b = v[2 * i + 1], si = inverse ? -s[i] : s[i];
      v[2 * i] = a * c[i] - b * si;
      v[2 * i + 1] = b * c[i] + a * si;
    }
  }
}

// Copies one row (main, scale and rope parts) between two caches of the same representation.
void copy_row(const ops::MlaKvCache& from, int64_t from_slot, const ops::MlaKvCache& to, int64_t to_slot,
              const ops::KvRowBytes& row) {
  const auto part = [&](const TensorView& f, const TensorView& t, int64_t bytes) {
    if (bytes == 0) return;
    std::memcpy(static_cast<std::byte*>(t.data()) + to_slot * bytes,
                static_cast<const std::byte*>(f.data()) + from_slot * bytes, static_cast<size_t>(bytes));
  };
  part(from.kv_cache, to.kv_cache, row.main);
  part(from.scale_cache, to.scale_cache, row.scale);
  part(from.rope_cache, to.rope_cache, row.rope);
}

// A projection: quant_linear with the layer's quantized weight when there is one, else linear (bf16).
Status project(const TensorView& x, const TensorView& w, const ops::QuantWeight* q, const TensorView& y) {
  return q ? ops::quant_linear(x, *q, y) : ops::linear(x, w, y);
}

TensorView f32_view(const std::vector<float>& v) {
  return TensorView(const_cast<float*>(v.data()), DType::kF32, {static_cast<int64_t>(v.size())});
}

// A 1-D fp32 copy of a norm weight (the compressors' norms act on fp32 pooled entries).
std::vector<float> to_f32(const TensorView& w) {
  std::vector<float> out(static_cast<size_t>(w.numel()));
  for (int64_t i = 0; i < w.numel(); ++i) {
    out[i] = w.dtype() == DType::kF32 ? w.data_as<const float>()[i] : bf16_to_float(w.data_as<const bf16_t>()[i]);
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<V4Attention>> V4Attention::create(const Checkpoint& checkpoint,
                                                         const runtime::DeviceOperator& dev,
                                                         const runtime::KvPagePool& pool,
                                                         const QuantizedWeights* quantized) {
  std::unique_ptr<V4Attention> a(new V4Attention(checkpoint, dev, quantized));
  const ModelConfig& c = a->config_;
  if (!c.is_deepseek_v4()) return invalid_argument("V4Attention: the model is not DeepSeek-V4");
  const DeepseekV4Config& d = c.dsv4;
  a->shape_ = kv_model_shape(c);
  GB_RETURN_IF_ERROR(dev.check_kv_shape(a->shape_));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t m = d.compress_ratio(l);
    GB_ASSIGN_OR_RETURN(ops::MlaKvCache win, dev.v4_window_view(pool, a->shape_, l));
    a->window_.push_back(win);
    ops::MlaKvCache comp;
    ops::IndexerKeyCache keys;
    TensorView state, index_state;
    if (m > 0) {
      GB_ASSIGN_OR_RETURN(comp, dev.v4_compressed_view(pool, a->shape_, l));
      GB_ASSIGN_OR_RETURN(state, dev.v4_compressor_state_view(pool, a->shape_, l, /*indexer=*/false));
    }
    if (m == 4) {
      GB_ASSIGN_OR_RETURN(keys, dev.v4_indexer_view(pool, a->shape_, l));
      GB_ASSIGN_OR_RETURN(index_state, dev.v4_compressor_state_view(pool, a->shape_, l, /*indexer=*/true));
    }
    const V4AttentionWeights& aw = a->w_.layers[l].v4;
    LayerNorms nw{to_f32(aw.q_norm), to_f32(aw.kv_norm), {}, {}};
    if (m > 0) nw.compressor = to_f32(aw.compressor.norm);
    if (m == 4) nw.index_compressor = to_f32(aw.index_compressor.norm);
    a->norms_.push_back(std::move(nw));
    a->compressed_.push_back(comp);
    a->index_keys_.push_back(keys);
    a->compressor_state_.push_back(state);
    a->index_compressor_state_.push_back(index_state);
  }
  a->main_inv_freq_ = rope_inv_freq(d.qk_rope_head_dim, c.rope_theta, nullptr);
  a->compress_inv_freq_ = rope_inv_freq(d.qk_rope_head_dim, d.compress_rope_theta, d.yarn ? &d.rope_scaling : nullptr);
  a->ones_.assign(static_cast<size_t>(c.head_dim), 1.0f);
  a->page_size_ = pool.geometry().page_size;
  a->softmax_scale_ = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  return a;
}

std::shared_ptr<V4Attention::Scratch> V4Attention::make_scratch(int64_t max_tokens, int64_t max_seqs) const {
  const ModelConfig& c = config_;
  const DeepseekV4Config& d = c.dsv4;
  const auto T = static_cast<size_t>(max_tokens), D = static_cast<size_t>(c.head_dim);
  const auto heads = static_cast<size_t>(c.num_attention_heads);
  auto s = std::make_shared<Scratch>();
  s->max_tokens = max_tokens;
  s->max_seqs = max_seqs;
  s->qa.resize(T * d.q_lora_rank);
  s->qr.resize(T * d.q_lora_rank);
  s->q.resize(T * heads * D);
  s->qn.resize(T * heads * D);
  s->kvp.resize(T * D);
  s->kv.resize(T * D);
  s->attn.resize(T * heads * D);
  s->z.resize(T * d.o_groups * d.o_lora_rank);
  s->rstd.resize(T * heads);
  const ops::KvRowBytes row = dev_.sharedkv_row_bytes(shape_);
  const auto rows = static_cast<size_t>(max_tokens + max_seqs * (d.sliding_window - 1));
  s->win_main.resize(rows * row.main);
  s->win_scale.resize(rows * row.scale);
  s->win_rope.resize(rows * row.rope);
  s->window_slots.resize(T * d.sliding_window);
  s->win_base.resize(static_cast<size_t>(max_seqs));
  s->new_slots.resize(T);
  bool csa = false;
  int64_t coff_width = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int64_t m = d.compress_ratio(l);
    if (m > 0) coff_width = std::max(coff_width, runtime::v4_compressor_coff(m) * c.head_dim);
    csa = csa || m == 4;
  }
  s->ckv.resize(T * coff_width);
  s->cgate.resize(T * coff_width);
  if (csa) {
    const auto ih = static_cast<size_t>(d.index_n_heads), id = static_cast<size_t>(d.index_head_dim);
    s->iq.resize(T * ih * id);
    s->iw.resize(T * ih);
    s->iq_c.resize(T * ih * id);
    s->iw_c.resize(T * ih);
    s->i_ctx.resize(T);
    s->i_qsl.resize(T + 1);
    s->i_rows.resize(T);
    s->i_topk.resize(T * d.index_topk);
    s->selection.resize(static_cast<size_t>(c.num_hidden_layers) * T * d.index_topk, -1);
  }
  return s;
}

TensorView V4Attention::index_selection(const Scratch& s, int64_t layer, int64_t num_tokens) const {
  if (config_.dsv4.compress_ratio(layer) != 4) return TensorView();
  const int64_t k = config_.dsv4.index_topk;
  return TensorView(const_cast<int32_t*>(s.selection.data()) + layer * s.max_tokens * k, DType::kI32, {num_tokens, k});
}

Status V4Attention::compress(Scratch& s, int64_t layer, bool indexer, const TensorView& x,
                             const V4AttentionBatch& b) const {
  const ModelConfig& c = config_;
  const DeepseekV4Config& d = c.dsv4;
  const V4AttentionWeights& aw = w_.layers[layer].v4;
  const V4CompressorWeights& cw = indexer ? aw.index_compressor : aw.compressor;
  const int64_t m = d.compress_ratio(layer), coff = runtime::v4_compressor_coff(m);
  const int64_t width = indexer ? d.index_head_dim : c.head_dim, cw2 = coff * width;
  const int64_t SR = runtime::v4_compressor_state_rows(m), R = d.qk_rope_head_dim, half = R / 2;
  const bool overlap = m == 4;
  const int64_t T = x.dim(0), S = static_cast<int64_t>(b.state_slots.size());
  const TensorView& state = indexer ? index_compressor_state_[layer] : compressor_state_[layer];
  const TensorView ckv(s.ckv.data(), DType::kF32, {T, cw2}), cgate(s.cgate.data(), DType::kF32, {T, cw2});
  GB_RETURN_IF_ERROR(ctx(ops::linear(x, cw.wkv, ckv), indexer ? "indexer compressor wkv" : "compressor wkv"));
  GB_RETURN_IF_ERROR(ctx(ops::linear(x, cw.wgate, cgate), indexer ? "indexer compressor wgate" : "compressor wgate"));
  const TensorView norm_w = f32_view(indexer ? norms_[layer].index_compressor : norms_[layer].compressor);
  const int64_t rpp = page_size_ / m;
  for (int64_t q = 0; q < S; ++q) {
    const int64_t r0 = b.query_start[q], n_new = b.query_start[q + 1] - r0;
    const int64_t L0 = b.positions[r0], L = L0 + n_new;
    const int64_t w_first = L0 / m, n = L / m - L0 / m;
    float* st = state.data_as<float>() + static_cast<int64_t>(b.state_slots[q]) * SR * 2 * cw2;
    // The row of position p: [kv | gate], from the state (p < L0) or this forward's projections.
    const auto put_row = [&](int64_t p, float* dst) {
      if (p < 0) {
        std::fill(dst, dst + 2 * cw2, 0.0f);
      } else if (p < L0) {
        std::memcpy(dst, st + (p % SR) * 2 * cw2, static_cast<size_t>(2 * cw2) * sizeof(float));
      } else {
        std::memcpy(dst, s.ckv.data() + (r0 + p - L0) * cw2, static_cast<size_t>(cw2) * sizeof(float));
        std::memcpy(dst + cw2, s.cgate.data() + (r0 + p - L0) * cw2, static_cast<size_t>(cw2) * sizeof(float));
      }
    };
    if (n > 0) {
      const int64_t first = m * w_first - (overlap ? m : 0), num_rows = m * (w_first + n) - first;
      s.rows.resize(static_cast<size_t>(num_rows * 2 * cw2));
      for (int64_t i = 0; i < num_rows; ++i) put_row(first + i, s.rows.data() + i * 2 * cw2);
      const TensorView kv_rows = TensorView::strided(s.rows.data(), DType::kF32, {num_rows, cw2}, {2 * cw2, 1});
      const TensorView gate_rows = TensorView::strided(s.rows.data() + cw2, DType::kF32, {num_rows, cw2}, {2 * cw2, 1});
      s.entries.resize(static_cast<size_t>(n * width));
      s.normed.resize(static_cast<size_t>(n * width));
      const TensorView entries(s.entries.data(), DType::kF32, {n, width}),
          normed(s.normed.data(), DType::kF32, {n, width});
      GB_RETURN_IF_ERROR(ctx(ops::kv_compress(kv_rows, gate_rows, cw.ape, m, overlap, w_first > 0, entries),
                             indexer ? "indexer compressor" : "compressor"));
      if (static_cast<int64_t>(s.rstd.size()) < n) s.rstd.resize(static_cast<size_t>(n));
      GB_RETURN_IF_ERROR(ctx(ops::rms_norm(entries, norm_w, static_cast<float>(c.rms_norm_eps), normed,
                                           TensorView(s.rstd.data(), DType::kF32, {n, 1})),
                             indexer ? "indexer compressor norm" : "compressor norm"));
      // RoPE (the compressed layers') at each window's first position, on the trailing rope dims.
      std::vector<int64_t> starts(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) starts[i] = m * (w_first + i);
      angles(starts, compress_inv_freq_, s.entry_cos, s.entry_sin);
      rotate_trailing(s.normed.data(), n, 1, width, width, s.entry_cos, s.entry_sin, half, /*inverse=*/false);
      s.entry_slots.resize(static_cast<size_t>(n));
      const int32_t* table = b.block_tables.data() + q * b.max_blocks;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t w = w_first + i, page = table[w / rpp];
        if (page < 0) {
          return internal_error(
              fmt::format("V4Attention: sequence {}'s block table has no page for compressed entry {}", q, w));
        }
        s.entry_slots[i] = page * rpp + w % rpp;
      }
      if (indexer) {
        GB_RETURN_IF_ERROR(
            ctx(dev_.write_indexer_keys(index_keys_[layer], normed, s.entry_slots), "indexer key write"));
      } else {
        const TensorView nope = TensorView::strided(s.normed.data(), DType::kF32, {n, width - R}, {width, 1});
        const TensorView rope = TensorView::strided(s.normed.data() + width - R, DType::kF32, {n, R}, {width, 1});
        GB_RETURN_IF_ERROR(
            ctx(dev_.write_sharedkv(compressed_[layer], nope, rope, s.entry_slots), "compressed entry write"));
      }
    }
    // Keep the rows the next windows need: the last SR positions (their row is position % SR).
    for (int64_t p = std::max(L0, L - SR); p < L; ++p) put_row(p, st + (p % SR) * 2 * cw2);
  }
  return ok_status();
}

Status V4Attention::forward(Scratch& s, int64_t layer, const TensorView& x, const V4AttentionBatch& b,
                            const TensorView& out) const {
  const ModelConfig& c = config_;
  const DeepseekV4Config& d = c.dsv4;
  const V4AttentionWeights& aw = w_.layers[layer].v4;
  const int64_t T = x.dim(0), S = static_cast<int64_t>(b.state_slots.size());
  if (T > s.max_tokens || S > s.max_seqs) {
    return invalid_argument(fmt::format("V4Attention: {} tokens from {} sequences exceed the planned {} from {}", T, S,
                                        s.max_tokens, s.max_seqs));
  }
  const int64_t heads = c.num_attention_heads, D = c.head_dim, R = d.qk_rope_head_dim, half = R / 2;
  const int64_t W = d.sliding_window, m = d.compress_ratio(layer);
  const float eps = static_cast<float>(c.rms_norm_eps);
  std::vector<int64_t> pos(b.positions.begin(), b.positions.begin() + T);
  angles(pos, m == 0 ? main_inv_freq_ : compress_inv_freq_, s.cos, s.sin);

  // Queries: qr = q_norm(wq_a x) (also the indexer's input); q = wq_b qr, each head divided by its RMS; RoPE.
  const TensorView qa(s.qa.data(), DType::kF32, {T, d.q_lora_rank}), qr(s.qr.data(), DType::kF32, {T, d.q_lora_rank});
  const LayerNorms& nw = norms_[layer];
  const QuantizedWeights::Layer* ql = quantized_ && quantized_->layer(layer).v4 ? &quantized_->layer(layer) : nullptr;
  GB_RETURN_IF_ERROR(ctx(project(x, aw.wq_a, ql ? &ql->wq_a : nullptr, qa), "wq_a"));
  GB_RETURN_IF_ERROR(
      ctx(ops::rms_norm(qa, f32_view(nw.q_norm), eps, qr, TensorView(s.rstd.data(), DType::kF32, {T, 1})), "q_norm"));
  const TensorView q(s.q.data(), DType::kF32, {T, heads * D});
  GB_RETURN_IF_ERROR(ctx(project(qr, aw.wq_b, ql ? &ql->wq_b : nullptr, q), "wq_b"));
  const TensorView qn(s.qn.data(), DType::kF32, {T, heads, D});
  GB_RETURN_IF_ERROR(ctx(ops::rms_norm(TensorView(s.q.data(), DType::kF32, {T, heads, D}),
                                       TensorView(const_cast<float*>(ones_.data()), DType::kF32, {D}), eps, qn,
                                       TensorView(s.rstd.data(), DType::kF32, {T, heads, 1})),
                         "query head norm"));
  rotate_trailing(s.qn.data(), T * heads, heads, D, D, s.cos, s.sin, half, /*inverse=*/false);
  // The shared K = V row: kv_norm(wkv x), RoPE on its trailing dims.
  const TensorView kvp(s.kvp.data(), DType::kF32, {T, D});
  GB_RETURN_IF_ERROR(ctx(project(x, aw.wkv, ql ? &ql->wkv : nullptr, kvp), "wkv"));
  GB_RETURN_IF_ERROR(ctx(ops::rms_norm(kvp, f32_view(nw.kv_norm), eps, TensorView(s.kv.data(), DType::kF32, {T, D}),
                                       TensorView(s.rstd.data(), DType::kF32, {T, 1})),
                         "kv_norm"));
  rotate_trailing(s.kv.data(), T, 1, D, D, s.cos, s.sin, half, /*inverse=*/false);

  // The window: per sequence the ring's rows before its first new token, then its new rows.
  const ops::KvRowBytes row = dev_.sharedkv_row_bytes(shape_);
  const int64_t scratch_rows = static_cast<int64_t>(s.win_main.size()) / std::max<int64_t>(1, row.main);
  const ops::MlaKvCache win =
      dev_.sharedkv_view(s.win_main.data(), s.win_scale.empty() ? nullptr : s.win_scale.data(),
                         s.win_rope.empty() ? nullptr : s.win_rope.data(), scratch_rows, shape_);
  const ops::MlaKvCache& ring = window_[layer];
  int64_t base = 0;
  for (int64_t q_ = 0; q_ < S; ++q_) {
    const int64_t r0 = b.query_start[q_], r1 = b.query_start[q_ + 1], L0 = b.positions[r0];
    const int64_t slot = b.state_slots[q_], first = L0 - (W - 1);  // scratch row base + p - first holds position p
    s.win_base[q_] = base;
    for (int64_t p = std::max<int64_t>(0, first); p < L0; ++p)
      copy_row(ring, slot * W + p % W, win, base + p - first, row);
    for (int64_t r = r0; r < r1; ++r) s.new_slots[r] = base + (b.positions[r] - first);
    base += (W - 1) + (r1 - r0);
  }
  const TensorView kv_nope = TensorView::strided(s.kv.data(), DType::kF32, {T, D - R}, {D, 1});
  const TensorView kv_rope = TensorView::strided(s.kv.data() + D - R, DType::kF32, {T, R}, {D, 1});
  GB_RETURN_IF_ERROR(ctx(dev_.write_sharedkv(win, kv_nope, kv_rope, std::span<const int64_t>(s.new_slots).first(T)),
                         "window row write"));
  for (int64_t q_ = 0; q_ < S; ++q_) {
    const int64_t r0 = b.query_start[q_], r1 = b.query_start[q_ + 1], L0 = b.positions[r0];
    const int64_t first = L0 - (W - 1);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p = b.positions[r];
      int32_t* ws = s.window_slots.data() + r * W;
      int64_t j = 0;
      for (int64_t x_ = std::max<int64_t>(0, p - W + 1); x_ <= p; ++x_)
        ws[j++] = static_cast<int32_t>(s.win_base[q_] + x_ - first);
      for (; j < W; ++j) ws[j] = -1;
    }
    // The ring keeps the newest W positions.
    const int64_t slot = b.state_slots[q_], L = L0 + (r1 - r0);
    for (int64_t p = std::max(L0, L - W); p < L; ++p)
      copy_row(win, s.win_base[q_] + p - first, ring, slot * W + p % W, row);
  }

  // Compressed entries: the windows this forward completes, then what each query sees.
  int64_t C = 0;
  if (m > 0) {
    GB_RETURN_IF_ERROR(compress(s, layer, /*indexer=*/false, x, b));
    const int64_t rpp = page_size_ / m;
    if (m == 4) {
      GB_RETURN_IF_ERROR(compress(s, layer, /*indexer=*/true, x, b));
      const int64_t ih = d.index_n_heads, id = d.index_head_dim, k = d.index_topk;
      const TensorView iq(s.iq.data(), DType::kF32, {T, ih * id}), iw(s.iw.data(), DType::kF32, {T, ih});
      GB_RETURN_IF_ERROR(ctx(ops::linear(qr, aw.index_wq_b, iq), "indexer wq_b"));
      rotate_trailing(s.iq.data(), T * ih, ih, id, id, s.cos, s.sin, half, /*inverse=*/false);
      GB_RETURN_IF_ERROR(ctx(ops::linear(x, aw.index_weights_proj, iw), "indexer weights_proj"));
      const float wscale =
          static_cast<float>(1.0 / std::sqrt(static_cast<double>(ih)) / std::sqrt(static_cast<double>(id)));
      // The queries with at least one complete window, each its own sequence over its sequence's entries.
      int64_t nq = 0;
      s.i_tables.resize(static_cast<size_t>(T * b.max_blocks));
      s.i_qsl[0] = 0;
      for (int64_t q_ = 0; q_ < S; ++q_) {
        for (int64_t r = b.query_start[q_]; r < b.query_start[q_ + 1]; ++r) {
          const int64_t visible = (b.positions[r] + 1) / m;
          if (visible < 1) continue;
          std::memcpy(s.iq_c.data() + nq * ih * id, s.iq.data() + r * ih * id,
                      static_cast<size_t>(ih * id) * sizeof(float));
          for (int64_t h = 0; h < ih; ++h) s.iw_c[nq * ih + h] = s.iw[r * ih + h] * wscale;
          std::memcpy(s.i_tables.data() + nq * b.max_blocks, b.block_tables.data() + q_ * b.max_blocks,
                      static_cast<size_t>(b.max_blocks) * sizeof(int32_t));
          s.i_ctx[nq] = static_cast<int32_t>(visible);
          s.i_rows[nq] = static_cast<int32_t>(r);
          ++nq;
          s.i_qsl[nq] = static_cast<int32_t>(nq);
        }
      }
      int32_t* sel = s.selection.data() + layer * s.max_tokens * k;
      std::fill(sel, sel + T * k, -1);
      if (nq > 0) {
        const runtime::AttentionBatch ib{.block_tables = TensorView(s.i_tables.data(), DType::kI32, {nq, b.max_blocks}),
                                         .context_lens = TensorView(s.i_ctx.data(), DType::kI32, {nq}),
                                         .query_start_loc = TensorView(s.i_qsl.data(), DType::kI32, {nq + 1})};
        GB_RETURN_IF_ERROR(ctx(dev_.index_topk(TensorView(s.iq_c.data(), DType::kF32, {nq, ih, id}),
                                               TensorView(s.iw_c.data(), DType::kF32, {nq, ih}), index_keys_[layer], ib,
                                               TensorView(s.i_topk.data(), DType::kI32, {nq, k})),
                               "indexer top-k"));
      }
      // The selection as entries (flat slots, when the generation's contract gives those, mapped back through
      // the sequence's block table) and as the compressed cache's slots.
      C = k;
      s.compressed_slots.assign(static_cast<size_t>(T * C), -1);
      const bool flat = dev_.topk_index_format() == ops::TopkIndexFormat::kFlatKvSlots;
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t r = s.i_rows[i];
        const int32_t* table = s.i_tables.data() + i * b.max_blocks;
        for (int64_t j = 0; j < k; ++j) {
          const int32_t v = s.i_topk[i * k + j];
          if (v < 0) continue;
          int64_t entry = v;
          if (flat) {
            entry = -1;
            for (int64_t blk = 0; blk < b.max_blocks && entry < 0; ++blk) {
              if (table[blk] == v / rpp) entry = blk * rpp + v % rpp;
            }
          }
          sel[r * k + j] = static_cast<int32_t>(entry);
          s.compressed_slots[r * C + j] = flat ? v : table[entry / rpp] * static_cast<int32_t>(rpp) + entry % rpp;
        }
      }
    } else {  // every complete window
      for (int64_t r = 0; r < T; ++r) C = std::max<int64_t>(C, (b.positions[r] + 1) / m);
      s.compressed_slots.assign(static_cast<size_t>(T * C), -1);
      for (int64_t q_ = 0; q_ < S; ++q_) {
        const int32_t* table = b.block_tables.data() + q_ * b.max_blocks;
        for (int64_t r = b.query_start[q_]; r < b.query_start[q_ + 1]; ++r) {
          const int64_t visible = (b.positions[r] + 1) / m;
          for (int64_t w = 0; w < visible; ++w) {
            s.compressed_slots[r * C + w] = table[w / rpp] * static_cast<int32_t>(rpp) + static_cast<int32_t>(w % rpp);
          }
        }
      }
    }
  }

  // One softmax over window and compressed rows with the sinks; then the inverse RoPE at the query position.
  const TensorView attn(s.attn.data(), DType::kF32, {T, heads, D});
  const TensorView q_nope = TensorView::strided(s.qn.data(), DType::kF32, {T, heads, D - R}, {heads * D, D, 1});
  const TensorView q_rope = TensorView::strided(s.qn.data() + D - R, DType::kF32, {T, heads, R}, {heads * D, D, 1});
  const ops::MlaKvCache none_cache = m > 0 ? compressed_[layer] : win;
  GB_RETURN_IF_ERROR(ctx(
      dev_.sharedkv_attention(q_nope, q_rope, win, TensorView(s.window_slots.data(), DType::kI32, {T, W}), none_cache,
                              TensorView(C > 0 ? s.compressed_slots.data() : nullptr, DType::kI32, {T, C}),
                              aw.attn_sink, softmax_scale_, attn),
      "attention"));
  rotate_trailing(s.attn.data(), T * heads, heads, D, D, s.cos, s.sin, half, /*inverse=*/true);
  // Grouped output projection: z_g = wo_a[g] o_g over each group's heads, then wo_b.
  const int64_t g = d.o_groups, hpg = heads / g, lr = d.o_lora_rank;
  for (int64_t gi = 0; gi < g; ++gi) {
    const TensorView og = TensorView::strided(s.attn.data() + gi * hpg * D, DType::kF32, {T, hpg * D}, {heads * D, 1});
    const TensorView zg = TensorView::strided(s.z.data() + gi * lr, DType::kF32, {T, lr}, {g * lr, 1});
    GB_RETURN_IF_ERROR(
        ctx(project(og, aw.wo_a.slice0(gi * lr, (gi + 1) * lr), ql ? &ql->wo_a[gi] : nullptr, zg), "wo_a"));
  }
  return ctx(project(TensorView(s.z.data(), DType::kF32, {T, g * lr}), aw.wo_b, ql ? &ql->wo_b : nullptr, out), "wo_b");
}

}  // namespace genbridge::model
