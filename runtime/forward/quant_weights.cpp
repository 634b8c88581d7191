#include "runtime/forward/quant_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "genbridge/ops/quant/normalize_mx_scale_layout.h"
#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/forward/deepseek_attention.h"

namespace genbridge::model {

namespace {

using ops::WeightQuantScheme;

// Row `row` of q as the fp32 values its matmul multiplies (quant_linear.h: W8A8 data * scale; MX code * 2^(s - 127),
// decoded a 32-block at a time).
void decode_row(const ops::QuantWeight& q, int64_t row, float* out) {
  const int64_t K = q.in_features;
  const uint8_t* d = q.data.data_as<const uint8_t>() + row * q.data.stride(0);
  if (q.scheme == WeightQuantScheme::kW8A8) {
    const float s = q.scale.data_as<const float>()[row * q.scale.stride(0)];
    for (int64_t k = 0; k < K; ++k) out[k] = static_cast<float>(static_cast<int8_t>(d[k])) * s;
    return;
  }
  const e8m0_t* s = q.scale.data_as<const e8m0_t>() + row * q.scale.stride(0);  // pairs contiguous: block j at j
  for (int64_t k0 = 0, j = 0; k0 < K; k0 += ops::kMxWeightBlock, ++j) {
    const auto n = static_cast<size_t>(std::min(ops::kMxWeightBlock, K - k0));
    if (q.scheme == WeightQuantScheme::kMxfp8) {
      fp8_e4m3fn_to_float_n(reinterpret_cast<const fp8_e4m3fn_t*>(d + k0), e8m0_to_float(s[j]), out + k0, n);
    } else {
      fp4_e2m1x2_to_float_n(d + k0 / 2, e8m0_to_float(s[j]), out + k0, n);
    }
  }
}

// Adds rows [0, n) of `part` against the fp32 values `v` ([n, K]) to the conversion's error sums: per row in
// increasing k, then the rows in order (the sums do not depend on the thread count).
void add_error(const ops::QuantWeight& part, const float* v, int64_t n, QuantizedWeights::SourceConversion& c) {
  const int64_t K = part.in_features;
  std::vector<double> err2(static_cast<size_t>(n)), ref2(static_cast<size_t>(n));
  parallel_for(n, 4 * K, [&](int64_t b, int64_t e) {
    std::vector<float> q(static_cast<size_t>(K));
    for (int64_t i = b; i < e; ++i) {
      decode_row(part, i, q.data());
      // 8 partial sums (element k into sum k % 8), then summed in order: a fixed order the compiler can vectorize.
      double e8[8] = {}, r8[8] = {};
      const float* w = v + i * K;
      int64_t k = 0;
      for (; k + 8 <= K; k += 8) {
        for (int l = 0; l < 8; ++l) {
          const double x = w[k + l], d = static_cast<double>(q[k + l]) - x;
          e8[l] += d * d;
          r8[l] += x * x;
        }
      }
      for (; k < K; ++k) {
        const double x = w[k], d = static_cast<double>(q[k]) - x;
        e8[k % 8] += d * d;
        r8[k % 8] += x * x;
      }
      for (int l = 0; l < 8; ++l) {
        err2[i] += e8[l];
        ref2[i] += r8[l];
      }
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    c.err2 += err2[i];
    c.ref2 += ref2[i];
  }
}

// Rows [r0, r1) of q.
ops::QuantWeight rows_of(const ops::QuantWeight& q, int64_t r0, int64_t r1) {
  ops::QuantWeight p = q;
  p.data = q.data.slice0(r0, r1);
  p.scale = q.scale.slice0(r0, r1);
  return p;
}

// The E8M0 byte of scale element i of an FP8 block weight (E8M0, F32 or BF16), or -1 when it is not a power of
// two E8M0 holds (2^-127 .. 2^127).
int e8m0_byte_at(const TensorView& s, int64_t i) {
  if (s.dtype() == DType::kE8M0) {
    const uint8_t b = s.data_as<const uint8_t>()[i];
    return b == 0xFF ? -1 : b;
  }
  const float v = s.dtype() == DType::kF32 ? s.data_as<const float>()[i] : bf16_to_float(s.data_as<const bf16_t>()[i]);
  if (!(v > 0) || !std::isfinite(v)) return -1;
  int e = 0;
  if (std::frexp(v, &e) != 0.5f) return -1;  // v = 0.5 * 2^e: a power of two
  const int b = e - 1 + 127;
  return b >= 0 && b <= 254 ? b : -1;
}

// Rows [row_begin, row_end) of an FP8 block weight as MXFP8 with the same e4m3 codes: the 32-block j of row n takes
// the E8M0 byte of its (n / block_n, 32 j / block_k) block's scale, so every value stays code * scale exactly. False,
// with nothing written, when block_k is not a multiple of 32 or a scale is not a power of two E8M0 holds.
bool fp8_blocks_as_mxfp8(const Checkpoint::Fp8Source& src, int64_t row_begin, int64_t row_end,
                         const ops::QuantWeight& q) {
  const Fp8BlockQuantConfig& c = src.config;
  const int64_t K = src.codes.dim(1), blocks_k = (K + c.block_k - 1) / c.block_k,
                nj = (K + ops::kMxWeightBlock - 1) / ops::kMxWeightBlock;
  if (c.block_k % ops::kMxWeightBlock != 0) return false;
  for (int64_t bn = row_begin / c.block_n; bn * c.block_n < row_end; ++bn) {
    for (int64_t bk = 0; bk < blocks_k; ++bk) {
      if (e8m0_byte_at(src.scale_inv, bn * blocks_k + bk) < 0) return false;
    }
  }
  const uint8_t* codes = src.codes.data_as<const uint8_t>();
  for (int64_t n = row_begin; n < row_end; ++n) {
    std::memcpy(q.data.data_as<uint8_t>() + (n - row_begin) * q.data.stride(0), codes + n * K, static_cast<size_t>(K));
    uint8_t* sc = q.scale.data_as<uint8_t>() + (n - row_begin) * q.scale.stride(0);
    for (int64_t j = 0; j < nj; ++j) {
      sc[j] = static_cast<uint8_t>(
          e8m0_byte_at(src.scale_inv, (n / c.block_n) * blocks_k + j * ops::kMxWeightBlock / c.block_k));
    }
  }
  return true;
}

// Bytes of an FP8 source's codes and scales for `rows` of its rows.
uint64_t fp8_source_bytes(const Checkpoint::Fp8Source& src, int64_t rows) {
  const int64_t N = src.codes.dim(0), K = src.codes.dim(1);
  const auto scale =
      static_cast<double>(src.scale_inv.numel() * static_cast<int64_t>(dtype_size(src.scale_inv.dtype())));
  return static_cast<uint64_t>(rows * K) +
         static_cast<uint64_t>(std::llround(scale * static_cast<double>(rows) / static_cast<double>(N)));
}

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

}  // namespace

double QuantizedWeights::SourceConversion::rel_rms_error() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0; }

ops::QuantWeight QuantizedWeights::allocate(const runtime::WeightQuantRepresentation& r, int64_t N, int64_t K,
                                            bool with_data) {
  const int64_t data_cols = r.weight_element == DType::kFp4E2M1x2 ? K / 2 : K;
  const int64_t data_bytes = N * data_cols;  // one byte per data element in every scheme
  const int64_t bytes = runtime::quant_weight_bytes(r, N, K) - (with_data ? 0 : data_bytes);
  buffers_.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(bytes)));  // zeroed: the pair padding
  uint8_t* p = buffers_.back().get();
  ops::QuantWeight q;
  q.scheme = r.scheme;
  q.in_features = K;
  if (with_data) {
    q.data = TensorView(p, r.weight_element, {N, data_cols});
    p += data_bytes;  // scales follow the data
  }
  if (r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel) {
    q.scale = TensorView(p, r.scale_dtype, {N});
  } else {
    q.scale = TensorView(p, r.scale_dtype, {N, ops::mx_scale_pairs_of(K), 2});
  }
  return q;
}

Result<ops::QuantWeight> QuantizedWeights::quantize_one(const TensorView& w) {
  if (const Checkpoint::Mxfp4Source* m4 = checkpoint_ ? checkpoint_->mxfp4_source(w) : nullptr) {
    return from_mxfp4_source(w, *m4);
  }
  const Checkpoint::Fp8Source* src = checkpoint_ ? checkpoint_->fp8_source(w) : nullptr;
  return quantize_one(w, src ? Fp8Rows{src, 0, w.dim(0), false} : Fp8Rows{});
}

Result<ops::QuantWeight> QuantizedWeights::from_mxfp4_source(const TensorView& w, const Checkpoint::Mxfp4Source& src) {
  const runtime::WeightQuantRepresentation& r = *mxfp4_repr_;
  const int64_t N = w.dim(0), K = w.dim(1);
  if (src.codes.dim(0) != N || src.codes.dim(1) * 2 != K || src.scales.dim(1) * kMxfp4BlockK != K) {
    return internal_error(fmt::format("quantize weights: the MXFP4 source of '{}' {} / {} does not make a {} matrix",
                                      src.name, src.codes.shape_string(), src.scales.shape_string(), w.shape_string()));
  }
  SourceConversion& c = from_mxfp4_;
  ops::QuantWeight q;
  if (r.scheme == WeightQuantScheme::kMxfp4 || r.scheme == WeightQuantScheme::kMxfp8) {
    // The file's E8M0 scale per 32 along K is the representation's: re-laid out into the pair layout the MX
    // matmuls read (quant/normalize_mx_scale_layout).
    if (r.scale_layout != runtime::MxScaleLayout::kPair || r.block_k != kMxfp4BlockK) {
      return internal_error(fmt::format("quantize weights: {} scales are not E8M0 per {} in the pair layout",
                                        ops::weight_quant_scheme_name(r.scheme), kMxfp4BlockK));
    }
    const bool keep = r.scheme == WeightQuantScheme::kMxfp4;
    q = allocate(r, N, K, /*with_data=*/!keep);
    GB_RETURN_IF_ERROR(ops::normalize_mx_scale_layout(src.scales, q.scale));
    if (keep) {
      q.data = src.codes;  // the file's codes, read in place: the same layout (element 2j in the low nibble)
      ++c.kept;
    } else {
      // Each e2m1 value as the e4m3 code of the same value (e4m3 holds all 16 exactly) under the same scale.
      uint8_t e4m3_of[16];
      for (int i = 0; i < 16; ++i) e4m3_of[i] = float_to_fp8_e4m3fn(fp4_e2m1_to_float(static_cast<uint8_t>(i))).bits;
      const uint8_t* codes = src.codes.data_as<const uint8_t>();
      parallel_for(N, K, [&](int64_t b, int64_t e) {
        for (int64_t n = b; n < e; ++n) {
          uint8_t* d = q.data.data_as<uint8_t>() + n * K;
          const uint8_t* c = codes + n * (K / 2);
          for (int64_t i = 0; i < K / 2; ++i) {  // element 2i in the low nibble, 2i + 1 in the high one
            d[2 * i] = e4m3_of[c[i] & 0xF];
            d[2 * i + 1] = e4m3_of[c[i] >> 4];
          }
        }
      });
      ++c.reencoded;
    }
  } else {
    // Requantized from the decoded values (e2m1 * 2^(s - 127): exact in fp32), a block of rows at a time: every
    // scheme's scales are per row, so blocks of rows give the bits of the whole matrix.
    q = allocate(r, N, K);
    constexpr int64_t kRows = 64;
    std::vector<float> rows(static_cast<size_t>(std::min(N, kRows) * K));
    const uint8_t* codes = src.codes.data_as<const uint8_t>();
    const e8m0_t* scales = src.scales.data_as<const e8m0_t>();
    for (int64_t r0 = 0; r0 < N; r0 += kRows) {
      const int64_t r1 = std::min(N, r0 + kRows), n = r1 - r0;
      parallel_for(n, 2 * K, [&](int64_t b, int64_t e) {
        for (int64_t i = r0 + b; i < r0 + e; ++i) {
          for (int64_t j = 0; j < K / kMxfp4BlockK; ++j) {
            fp4_e2m1x2_to_float_n(codes + i * (K / 2) + j * (kMxfp4BlockK / 2),
                                  e8m0_to_float(scales[i * (K / kMxfp4BlockK) + j]),
                                  rows.data() + (i - r0) * K + j * kMxfp4BlockK, kMxfp4BlockK);
          }
        }
      });
      const ops::QuantWeight part = rows_of(q, r0, r1);
      GB_RETURN_IF_ERROR(ops::quantize_weight(TensorView(rows.data(), DType::kF32, {n, K}), part));
      add_error(part, rows.data(), n, c);
    }
    ++c.requantized;
  }
  const auto bytes = static_cast<uint64_t>(runtime::quant_weight_bytes(r, N, K));
  c.repr = &r;
  ++c.matrices;
  c.source_bytes += static_cast<uint64_t>(src.codes.numel() + src.scales.numel());
  c.bytes += bytes;
  quantized_bytes_ += bytes;
  replaced_bytes_ += static_cast<uint64_t>(N * K) * dtype_size(w.dtype());
  return q;
}

Result<ops::QuantWeight> QuantizedWeights::quantize_one(const TensorView& w, const Fp8Rows& fp8) {
  const runtime::WeightQuantRepresentation& r = *repr_;
  const int64_t N = w.dim(0), K = w.dim(1);
  const int64_t bytes = runtime::quant_weight_bytes(r, N, K);
  if (fp8.source && (fp8.row_end - fp8.row_begin != (fp8.transposed ? K : N) ||
                     fp8.source->codes.dim(1) != (fp8.transposed ? N : K))) {
    return internal_error(fmt::format("quantize weights: rows [{}, {}) of '{}' {} do not make a {} matrix{}",
                                      fp8.row_begin, fp8.row_end, fp8.source->name, fp8.source->codes.shape_string(),
                                      w.shape_string(), fp8.transposed ? " transposed" : ""));
  }
  const ops::QuantWeight q = allocate(r, N, K);
  SourceConversion& c = from_fp8_;
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
    add_error(q, t.data(), N, c);
    ++c.requantized;
  } else if (src && r.scheme == WeightQuantScheme::kMxfp8 && fp8_blocks_as_mxfp8(*src, fp8.row_begin, fp8.row_end, q)) {
    ++c.kept;  // the same e4m3 codes, each block's power-of-two scale repeated per 32 along K: exact
  } else if (src) {
    // An FP8 block-scaled checkpoint's weight (or rows of one: W_UV of kv_b, a DeepSeek-V4 wo_a group): converted
    // from the file's codes and block scales, decoded to fp32 (one rounding of the exact product) a block of rows
    // at a time, without the bf16 step. Every scheme's scales are per row, so converting rows in blocks gives the
    // bits of the whole matrix at once.
    constexpr int64_t kRows = 64;
    std::vector<float> rows(static_cast<size_t>(std::min(N, kRows) * K));
    for (int64_t r0 = 0; r0 < N; r0 += kRows) {
      const int64_t r1 = std::min(N, r0 + kRows), n = r1 - r0;
      GB_RETURN_IF_ERROR(dequantize_fp8_rows_f32(src->codes, src->scale_inv, src->config, src->file, src->name,
                                                 fp8.row_begin + r0, fp8.row_begin + r1, rows.data()));
      const ops::QuantWeight part = rows_of(q, r0, r1);
      GB_RETURN_IF_ERROR(ops::quantize_weight(TensorView(rows.data(), DType::kF32, {n, K}), part));
      add_error(part, rows.data(), n, c);
    }
    ++c.requantized;
  } else {
    GB_RETURN_IF_ERROR(ops::quantize_weight(w, q));
  }
  if (fp8.source) {
    c.repr = &r;
    ++c.matrices;
    c.source_bytes += fp8_source_bytes(*fp8.source, fp8.row_end - fp8.row_begin);
    c.bytes += static_cast<uint64_t>(bytes);
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
  q->mxfp4_repr_ = options.mxfp4_repr ? options.mxfp4_repr : &repr;
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
    if (attn && l.v4.wq_a.rank() == 2) total += 4 + c.dsv4.o_groups;
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
    if (attn && l.v4.wq_a.rank() == 2) {  // DeepSeek-V4: the projections V4Attention runs; wo_a per output group
      ql.v4 = true;
      const V4AttentionWeights& a = l.v4;
      GB_ASSIGN_OR_RETURN(ql.wq_a, one(a.wq_a));
      GB_ASSIGN_OR_RETURN(ql.wq_b, one(a.wq_b));
      GB_ASSIGN_OR_RETURN(ql.wkv, one(a.wkv));
      const Checkpoint::Fp8Source* wo_a8 = checkpoint.fp8_source(a.wo_a);
      const int64_t lr = c.dsv4.o_lora_rank;
      for (int64_t g = 0; g < c.dsv4.o_groups; ++g) {
        GB_ASSIGN_OR_RETURN(
            ops::QuantWeight wo_a,
            one(a.wo_a.slice0(g * lr, (g + 1) * lr), wo_a8 ? Fp8Rows{wo_a8, g * lr, (g + 1) * lr, false} : Fp8Rows{}));
        ql.wo_a.push_back(wo_a);
      }
      GB_ASSIGN_OR_RETURN(ql.wo_b, one(a.wo_b));
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
  const bool experts_differ = from_mxfp4_.matrices > 0 && from_mxfp4_.repr->scheme != repr_->scheme;
  std::string what;
  if (attention_side_ && expert_end_ > expert_begin_ && !share_) {
    what = experts_differ ? fmt::format("attention projections and shared experts, {} for routed experts",
                                        ops::weight_quant_scheme_name(from_mxfp4_.repr->scheme))
                          : "attention projections and experts";
  } else {
    if (attention_side_) what = "the attention side (attention projections, shared experts, dense MLPs)";
    if (expert_end_ > expert_begin_) {
      if (!what.empty()) what += " and ";
      if (experts_differ && attention_side_)
        what += fmt::format("{} for ", ops::weight_quant_scheme_name(from_mxfp4_.repr->scheme));
      what += fmt::format("routed experts [{}, {}) of {}", expert_begin_, expert_end_, num_experts_);
    }
    if (what.empty()) what = "nothing";
  }
  // An FFN rank's share of MXFP4 experts in another representation is named by it.
  const runtime::WeightQuantRepresentation& named = !attention_side_ && experts_differ ? *from_mxfp4_.repr : *repr_;
  const std::string fp8 =
      from_fp8_.matrices ? fmt::format(", {} of them from the checkpoint's FP8 blocks directly", from_fp8_.matrices)
                         : std::string();
  std::string out = fmt::format(
      "{} for {} ({} matrices{}: {:.1f} MiB from {:.1f} MiB bf16, quantized at load in {:.2f} s)",
      ops::weight_quant_scheme_name(named.scheme), what, matrices_, fp8,
      static_cast<double>(quantized_bytes_) / (1 << 20), static_cast<double>(replaced_bytes_) / (1 << 20), seconds_);
  // What the checkpoint's own quantized weights became, with the bytes and the measured error: never silently.
  const auto conversion = [&](const SourceConversion& c, const char* form, const char* how_kept) {
    if (c.matrices == 0) return;
    std::vector<std::string> parts;
    if (c.kept) parts.push_back(fmt::format("{} exactly ({})", c.kept, how_kept));
    if (c.reencoded)
      parts.push_back(
          fmt::format("{} exactly (each e2m1 code as the e4m3 code of its value, the same scales)", c.reencoded));
    if (c.requantized) {
      parts.push_back(fmt::format("{} requantized from the decoded values (relative RMS error {:.3g}%)", c.requantized,
                                  100 * c.rel_rms_error()));
    }
    out += fmt::format("; the checkpoint's {} ({} matrices, {} in the file) -> {}, {}: {}", form, c.matrices,
                       mib(c.source_bytes), ops::weight_quant_scheme_name(c.repr->scheme), mib(c.bytes),
                       fmt::join(parts, ", "));
  };
  conversion(from_fp8_, "FP8 blocks", "the file's e4m3 codes, each block's scale repeated per 32 along K");
  conversion(from_mxfp4_, "MXFP4 blocks", "the file's codes, read in place, and scales");
  return out;
}

}  // namespace genbridge::model
