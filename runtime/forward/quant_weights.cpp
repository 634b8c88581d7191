#include "runtime/forward/quant_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "runtime/forward/deepseek_attention.h"

namespace genbridge::model {

Result<ops::QuantWeight> QuantizedWeights::quantize_one(const TensorView& w) {
  const Checkpoint::Fp8Source* src = checkpoint_ ? checkpoint_->fp8_source(w) : nullptr;
  return quantize_one(w, src ? Fp8Rows{src, 0, w.dim(0), false} : Fp8Rows{});
}

Result<ops::QuantWeight> QuantizedWeights::quantize_one(const TensorView& w, const Fp8Rows& fp8) {
  const runtime::WeightQuantRepresentation& r = *repr_;
  const int64_t N = w.dim(0), K = w.dim(1);
  const int64_t data_cols = r.weight_element == DType::kFp4E2M1x2 ? K / 2 : K;
  const int64_t bytes = runtime::quant_weight_bytes(r, N, K);
  buffers_.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(bytes)));
  uint8_t* p = buffers_.back().get();
  ops::QuantWeight q;
  q.scheme = r.scheme;
  q.in_features = K;
  q.data = TensorView(p, r.weight_element, {N, data_cols});
  uint8_t* s = p + N * data_cols;  // scales follow the data
  if (r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel) {
    q.scale = TensorView(s, r.scale_dtype, {N});
  } else {
    q.scale = TensorView(s, r.scale_dtype, {N, ops::mx_scale_pairs_of(K), 2});
  }
  if (fp8.source && (fp8.row_end - fp8.row_begin != (fp8.transposed ? K : N) ||
                     fp8.source->codes.dim(1) != (fp8.transposed ? N : K))) {
    return internal_error(fmt::format("quantize weights: rows [{}, {}) of '{}' {} do not make a {} matrix{}",
                                      fp8.row_begin, fp8.row_end, fp8.source->name, fp8.source->codes.shape_string(),
                                      w.shape_string(), fp8.transposed ? " transposed" : ""));
  }
  if (const Checkpoint::Fp8Source* src = fp8.source; src && fp8.transposed) {
    // W_UK^T of an FP8 kv_b: the source rows [row_begin, row_end) (W_UK [K, src K]) decoded to fp32 and
    // transposed, so the scales run along the rows' count as the absorbed product reads them.
    const int64_t R = src->codes.dim(1);
    std::vector<float> rows(static_cast<size_t>(K * R)), t(static_cast<size_t>(N * K));
    GB_RETURN_IF_ERROR(dequantize_fp8_rows_f32(src->codes, src->scale_inv, src->config, src->file, src->name,
                                               fp8.row_begin, fp8.row_end, rows.data()));
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < N; ++j) t[static_cast<size_t>(j * K + i)] = rows[static_cast<size_t>(i * R + j)];
    }
    GB_RETURN_IF_ERROR(ops::quantize_weight(TensorView(t.data(), DType::kF32, {N, K}), q));
    ++from_fp8_;
  } else if (src) {
    // An FP8 block-scaled checkpoint's weight (or rows of one: W_UV of kv_b): converted from the file's codes
    // and block scales, decoded to fp32 (one rounding of the exact product) a block of rows at a time, without
    // the bf16 step. Every scheme's scales are per row, so converting rows in blocks gives the bits of the
    // whole matrix at once.
    constexpr int64_t kRows = 64;
    const int64_t scale_row_bytes =
        (r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel ? 1 : 2 * ops::mx_scale_pairs_of(K)) *
        static_cast<int64_t>(dtype_size(r.scale_dtype));
    std::vector<float> rows(static_cast<size_t>(std::min(N, kRows) * K));
    for (int64_t r0 = 0; r0 < N; r0 += kRows) {
      const int64_t r1 = std::min(N, r0 + kRows), n = r1 - r0;
      GB_RETURN_IF_ERROR(dequantize_fp8_rows_f32(src->codes, src->scale_inv, src->config, src->file, src->name,
                                                 fp8.row_begin + r0, fp8.row_begin + r1, rows.data()));
      ops::QuantWeight part = q;
      part.data = TensorView(p + r0 * data_cols, r.weight_element, {n, data_cols});
      part.scale = r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel
                       ? TensorView(s + r0 * scale_row_bytes, r.scale_dtype, {n})
                       : TensorView(s + r0 * scale_row_bytes, r.scale_dtype, {n, ops::mx_scale_pairs_of(K), 2});
      GB_RETURN_IF_ERROR(ops::quantize_weight(TensorView(rows.data(), DType::kF32, {n, K}), part));
    }
    ++from_fp8_;
  } else {
    GB_RETURN_IF_ERROR(ops::quantize_weight(w, q));
  }
  quantized_bytes_ += static_cast<uint64_t>(bytes);
  replaced_bytes_ += static_cast<uint64_t>(N * K) * dtype_size(w.dtype());
  return q;
}

Result<std::unique_ptr<QuantizedWeights>> QuantizedWeights::quantize(const Checkpoint& checkpoint,
                                                                     const runtime::WeightQuantRepresentation& repr,
                                                                     const runtime::QuantizedLayers& roles,
                                                                     const QuantizeOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<QuantizedWeights> q(new QuantizedWeights());
  q->repr_ = &repr;
  q->checkpoint_ = &checkpoint;
  const ModelWeights& w = checkpoint.weights();
  const int64_t E = checkpoint.config().num_experts;
  const int64_t eb = options.expert_begin, ee = options.expert_end < 0 ? E : options.expert_end;
  if (eb < 0 || eb > ee || ee > E) {
    return invalid_argument(fmt::format(
        "quantize weights: the expert range [{}, {}) is not inside the model's {} experts", eb, options.expert_end, E));
  }
  const bool attn = roles.attention_projections && options.attention;
  const bool experts = roles.experts && options.experts;
  const bool shared = roles.shared_experts && options.attention;  // shared experts run on the attention side
  const bool dense = roles.shared_experts && options.attention;   // dense MLPs run on the attention side
  // A layer's shared experts, when the model has them: Qwen's gated shared_expert or DeepSeek's ungated
  // shared_experts (n_shared_experts > 0), both bound into MoeWeights::shared_expert.
  const auto has_shared = [](const LayerWeights& l) { return l.is_moe && l.moe.shared_expert.gate_proj.rank() == 2; };
  q->attention_side_ = options.attention && (roles.attention_projections || roles.shared_experts);
  q->experts_role_ = roles.experts;
  q->share_ = !options.attention || !options.experts || eb != 0 || ee != E;
  q->num_experts_ = E;
  q->expert_begin_ = experts ? eb : 0;
  q->expert_end_ = experts ? ee : 0;
  const ModelConfig& c = checkpoint.config();
  const int64_t heads = c.num_attention_heads;
  int64_t total = 0;
  for (const LayerWeights& l : w.layers) {
    if (attn && l.attn.q_proj.rank() == 2) total += 4;
    if (attn && l.mla.kv_b_proj.rank() == 2) total += (l.mla.q_a_proj.rank() == 2 ? 4 : 3) + 2 * heads;
    if (l.is_moe && experts) total += 3 * (ee - eb);
    if (shared && has_shared(l)) total += 3;
    if (!l.is_moe && dense) total += 3;
  }
  int64_t done = 0;
  auto one = [&](const TensorView& t, std::optional<Fp8Rows> fp8 = std::nullopt) -> Result<ops::QuantWeight> {
    GB_ASSIGN_OR_RETURN(ops::QuantWeight r, fp8 ? q->quantize_one(t, *fp8) : q->quantize_one(t));
    ++done;
    if (options.progress && *options.progress) (*options.progress)(done, total);
    return r;
  };
  auto mlp = [&](const MlpWeights& m) -> Result<ops::QuantExpertWeights> {
    ops::QuantExpertWeights e;
    GB_ASSIGN_OR_RETURN(e.w_gate, one(m.gate_proj));
    GB_ASSIGN_OR_RETURN(e.w_up, one(m.up_proj));
    GB_ASSIGN_OR_RETURN(e.w_down, one(m.down_proj));
    return e;
  };
  for (const LayerWeights& l : w.layers) {
    Layer ql;
    if (attn && l.attn.q_proj.rank() == 2) {  // GQA projections (an MLA model's attention stays bf16)
      ql.attention = true;
      GB_ASSIGN_OR_RETURN(ql.q_proj, one(l.attn.q_proj));
      GB_ASSIGN_OR_RETURN(ql.k_proj, one(l.attn.k_proj));
      GB_ASSIGN_OR_RETURN(ql.v_proj, one(l.attn.v_proj));
      GB_ASSIGN_OR_RETURN(ql.o_proj, one(l.attn.o_proj));
    }
    if (attn && l.mla.kv_b_proj.rank() == 2) {  // MLA: the projections in the layout the absorbed form reads
      ql.mla = true;
      const MlaWeights& a = l.mla;
      const DeepseekConfig& d = c.deepseek;
      if (a.q_a_proj.rank() == 2) {
        GB_ASSIGN_OR_RETURN(ql.q_a_proj, one(a.q_a_proj));
        GB_ASSIGN_OR_RETURN(ql.q_b_proj, one(a.q_b_proj));
      } else {
        GB_ASSIGN_OR_RETURN(ql.q_proj, one(a.q_proj));
      }
      GB_ASSIGN_OR_RETURN(ql.kv_a_proj, one(a.kv_a_proj_with_mqa));
      // kv_b per head: W_UK[h] is rows [h (nope + v), h (nope + v) + nope), W_UV[h] the v rows after them. An
      // FP8 kv_b converts both halves from its codes (W_UK^T transposed in fp32); a bf16 one from the view.
      const Checkpoint::Fp8Source* kv_b8 = checkpoint.fp8_source(a.kv_b_proj);
      const int64_t per_head = d.qk_nope_head_dim + d.v_head_dim;
      std::vector<bf16_t> t(static_cast<size_t>(d.kv_lora_rank * d.qk_nope_head_dim));
      for (int64_t h = 0; h < heads; ++h) {
        if (!kv_b8) mla_w_uk_t(a.kv_b_proj, d, h, t.data());
        const int64_t uk0 = h * per_head, uv0 = uk0 + d.qk_nope_head_dim;
        GB_ASSIGN_OR_RETURN(ops::QuantWeight uk,
                            one(TensorView(t.data(), DType::kBF16, {d.kv_lora_rank, d.qk_nope_head_dim}),
                                kv_b8 ? Fp8Rows{kv_b8, uk0, uv0, true} : Fp8Rows{}));
        ql.w_uk_t.push_back(uk);
        GB_ASSIGN_OR_RETURN(
            ops::QuantWeight uv,
            one(mla_w_uv(a.kv_b_proj, d, h), kv_b8 ? Fp8Rows{kv_b8, uv0, uv0 + d.v_head_dim, false} : Fp8Rows{}));
        ql.w_uv.push_back(uv);
      }
      GB_ASSIGN_OR_RETURN(ql.o_proj, one(a.o_proj));
    }
    if (l.is_moe && experts) {
      ql.experts.resize(l.moe.experts.size());
      for (int64_t e = eb; e < ee; ++e) {
        GB_ASSIGN_OR_RETURN(ql.experts[static_cast<size_t>(e)], mlp(l.moe.experts[static_cast<size_t>(e)]));
      }
    }
    if (shared && has_shared(l)) {
      ql.shared = true;
      GB_ASSIGN_OR_RETURN(ql.shared_expert, mlp(l.moe.shared_expert));
    }
    if (!l.is_moe && dense) {
      ql.dense = true;
      GB_ASSIGN_OR_RETURN(ql.dense_mlp, mlp(l.dense));
    }
    q->layers_.push_back(std::move(ql));
  }
  q->matrices_ = done;
  q->seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return q;
}

std::string QuantizedWeights::describe() const {
  std::string what;
  if (attention_side_ && expert_end_ > expert_begin_ && !share_) {
    what = "attention projections and experts";
  } else {
    if (attention_side_) what = "the attention side (attention projections, shared experts, dense MLPs)";
    if (expert_end_ > expert_begin_) {
      if (!what.empty()) what += " and ";
      what += fmt::format("routed experts [{}, {}) of {}", expert_begin_, expert_end_, num_experts_);
    }
    if (what.empty()) what = "nothing";
  }
  const std::string fp8 =
      from_fp8_ ? fmt::format(", {} of them from the checkpoint's FP8 blocks directly", from_fp8_) : std::string();
  return fmt::format("{} for {} ({} matrices{}: {:.1f} MiB from {:.1f} MiB bf16, quantized at load in {:.2f} s)",
                     ops::weight_quant_scheme_name(repr_->scheme), what, matrices_, fp8,
                     static_cast<double>(quantized_bytes_) / (1 << 20),
                     static_cast<double>(replaced_bytes_) / (1 << 20), seconds_);
}

}  // namespace genbridge::model
