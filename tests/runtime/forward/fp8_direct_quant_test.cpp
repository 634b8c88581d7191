// --weight-quant on an FP8 block-scaled checkpoint: each F8_E4M3 weight is converted into the
// generation's scheme from the file's codes and block scales (decoded to fp32, no bf16 step), not from the
// bf16 copy Checkpoint::open binds. Oracle: the codes and scale_inv decoded here, quantized by the stable
// op; MXFP8's conversion error against the FP8 values is bounded per 32-block (docs/quant_weights.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/fp8_checkpoint.h"
#include "runtime/forward/quant_weights.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

struct Buffer {
  std::vector<uint8_t> bytes;
  ops::QuantWeight q;
};
Buffer quantize(const runtime::WeightQuantRepresentation& r, const TensorView& w) {
  const int64_t N = w.dim(0), K = w.dim(1);
  const int64_t cols = r.weight_element == DType::kFp4E2M1x2 ? K / 2 : K;
  Buffer b;
  b.bytes.resize(static_cast<size_t>(runtime::quant_weight_bytes(r, N, K)));
  b.q.scheme = r.scheme;
  b.q.in_features = K;
  b.q.data = TensorView(b.bytes.data(), r.weight_element, {N, cols});
  uint8_t* s = b.bytes.data() + N * cols;
  b.q.scale = r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel
                  ? TensorView(s, r.scale_dtype, {N})
                  : TensorView(s, r.scale_dtype, {N, ops::mx_scale_pairs_of(K), 2});
  EXPECT_TRUE(ops::quantize_weight(w, b.q).ok());
  return b;
}

bool same_bytes(const ops::QuantWeight& a, const ops::QuantWeight& b) {
  auto n = [](const TensorView& v) { return static_cast<size_t>(v.numel()) * dtype_size(v.dtype()); };
  return n(a.data) == n(b.data) && n(a.scale) == n(b.scale) &&
         std::memcmp(a.data.data(), b.data.data(), n(a.data)) == 0 &&
         std::memcmp(a.scale.data(), b.scale.data(), n(a.scale)) == 0;
}

// The FP8 weight's values, decoded here: e4m3(code) * scale_inv[n / bn, k / bk] in fp32.
std::vector<float> fp8_values(const Checkpoint::Fp8Source& src) {
  const int64_t N = src.codes.dim(0), K = src.codes.dim(1);
  const int64_t bk = (K + src.config.block_k - 1) / src.config.block_k;
  std::vector<float> v(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t si = (n / src.config.block_n) * bk + k / src.config.block_k;
      const float s = src.scale_inv.dtype() == DType::kF32 ? src.scale_inv.data_as<const float>()[si]
                                                           : bf16_to_float(src.scale_inv.data_as<const bf16_t>()[si]);
      v[n * K + k] = fp8_e4m3fn_to_float(fp8_e4m3fn_t{src.codes.data_as<const uint8_t>()[n * K + k]}) * s;
    }
  }
  return v;
}

TEST(Fp8DirectQuant, fp8_weights_convert_from_codes_and_scales_without_bf16) {
  genbridge::testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 2, dir / "m").ok());
  ASSERT_TRUE(convert_checkpoint_to_fp8(dir / "m").ok());  // what `make-model --weight-quant fp8` writes
  const Checkpoint ckpt = Checkpoint::open(dir / "m").value();
  const runtime::GenerationContract& contract = runtime::DeviceOperator::create({}).value().contract();
  std::vector<std::pair<const TensorView*, const ops::QuantWeight*>> checked;
  for (int i = 0; i < contract.weight_quant.num_offered; ++i) {
    const runtime::WeightQuantRepresentation& r = contract.weight_quant.offered[i];
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(r.scheme)));
    auto q = QuantizedWeights::quantize(ckpt, r, contract.weight_quant.layers);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    // Every quantized role of the tiny preset is FP8 in the converted file.
    EXPECT_EQ((*q)->num_from_fp8(), (*q)->num_matrices());
    EXPECT_NE((*q)->describe().find(std::to_string((*q)->num_matrices()) +
                                    " of them from the checkpoint's FP8 blocks directly"),
              std::string::npos)
        << (*q)->describe();
    int differs_from_bf16_path = 0, matrices = 0;
    for (int64_t l = 0; l < ckpt.config().num_hidden_layers; ++l) {
      const LayerWeights& lw = ckpt.weights().layers[static_cast<size_t>(l)];
      const QuantizedWeights::Layer& ql = (*q)->layer(l);
      std::vector<std::pair<const TensorView*, const ops::QuantWeight*>> mats = {
          {&lw.attn.q_proj, &ql.q_proj}, {&lw.attn.k_proj, &ql.k_proj}, {&lw.attn.o_proj, &ql.o_proj}};
      if (lw.is_moe) {
        mats.push_back({&lw.moe.experts[1].down_proj, &ql.experts[1].w_down});
        mats.push_back({&lw.moe.experts[0].gate_proj, &ql.experts[0].w_gate});
      }
      for (auto [w, got] : mats) {
        const Checkpoint::Fp8Source* src = ckpt.fp8_source(*w);
        ASSERT_NE(src, nullptr) << "layer " << l;
        const int64_t N = w->dim(0), K = w->dim(1);
        std::vector<float> v = fp8_values(*src);
        const Buffer want = quantize(r, TensorView(v.data(), DType::kF32, {N, K}));
        EXPECT_TRUE(same_bytes(*got, want.q)) << "layer " << l << " " << src->name;
        differs_from_bf16_path += !same_bytes(*got, quantize(r, *w).q);
        ++matrices;
        if (r.scheme != ops::WeightQuantScheme::kMxfp8) continue;
        // MXFP8 vs the FP8 values: |err| <= 2^-4 |v| + amax32 / (448 * 512) (kCeil scale: no saturation; the
        // e4m3 rounding is 2^-4 relative for normals, half a subnormal step 2^-10 * 2^e otherwise, and
        // 2^e < 2 amax32 / 448).
        const uint8_t* codes = got->data.data_as<const uint8_t>();
        const uint8_t* scales = got->scale.data_as<const uint8_t>();
        for (int64_t n = 0; n < N; ++n) {
          for (int64_t j = 0; j * 32 < K; ++j) {
            float amax = 0;
            for (int64_t k = j * 32; k < std::min(K, (j + 1) * 32); ++k) amax = std::max(amax, std::fabs(v[n * K + k]));
            const int e = scales[n * 2 * ops::mx_scale_pairs_of(K) + j];
            for (int64_t k = j * 32; k < std::min(K, (j + 1) * 32); ++k) {
              const double x = std::ldexp(fp8_e4m3fn_to_float(fp8_e4m3fn_t{codes[n * K + k]}), e - 127);
              const double ref = v[n * K + k];
              ASSERT_LE(std::fabs(x - ref), std::ldexp(std::fabs(ref), -4) + amax / (448.0 * 512.0))
                  << src->name << " [" << n << ", " << k << "]";
            }
          }
        }
      }
    }
    // The bf16 step changes some W8A8 and MXFP8 results (here: not MXFP4's, whose 8 magnitudes absorb it):
    // the conversion does not go through it.
    if (r.scheme != ops::WeightQuantScheme::kMxfp4) {
      EXPECT_GT(differs_from_bf16_path, 0) << "of " << matrices;
    }
    std::printf("%s: %d of %d checked matrices differ from the bf16 path\n",
                std::string(ops::weight_quant_scheme_name(r.scheme)).c_str(), differs_from_bf16_path, matrices);
  }
}

// Rows [r0, r1) of an FP8 weight's values (fp8_values), transposed when `transpose`: [r1 - r0, K] or [K, r1 - r0].
std::vector<float> rows_of(const std::vector<float>& v, int64_t K, int64_t r0, int64_t r1, bool transpose) {
  const int64_t n = r1 - r0;
  std::vector<float> out(static_cast<size_t>(n * K));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < K; ++k) out[static_cast<size_t>(transpose ? k * n + i : i * K + k)] = v[(r0 + i) * K + k];
  }
  return out;
}

// DeepSeek (MLA): q_a/q_b or q, kv_a, o and both halves of kv_b -- W_UK^T (the key rows of each head,
// transposed) and W_UV (its value rows) -- convert from the FP8 codes and scales; so do the experts, the
// shared experts and the dense MLP. Every quantized matrix equals the stable op applied to the codes decoded
// here, and the converted W_UV differs from what the bf16 copy would have given.
class Fp8DirectQuantMla : public ::testing::TestWithParam<const char*> {};

TEST_P(Fp8DirectQuantMla, every_mla_matrix_converts_from_codes_including_both_kv_b_halves) {
  genbridge::testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint(GetParam(), 2, dir / "m").ok());
  ASSERT_TRUE(convert_checkpoint_to_fp8(dir / "m").ok());
  const Checkpoint ckpt = Checkpoint::open(dir / "m").value();
  const ModelConfig& c = ckpt.config();
  const DeepseekConfig& d = c.deepseek;
  const runtime::GenerationContract& contract = runtime::DeviceOperator::create({}).value().contract();
  for (int i = 0; i < contract.weight_quant.num_offered; ++i) {
    const runtime::WeightQuantRepresentation& r = contract.weight_quant.offered[i];
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(r.scheme)));
    auto q = QuantizedWeights::quantize(ckpt, r, contract.weight_quant.layers);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    EXPECT_EQ((*q)->num_from_fp8(), (*q)->num_matrices());
    int64_t uv_codes = 0, uv_codes_differ_from_bf16 = 0, uv_matrices_differ = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const MlaWeights& a = ckpt.weights().layers[static_cast<size_t>(l)].mla;
      const QuantizedWeights::Layer& ql = (*q)->layer(l);
      ASSERT_TRUE(ql.mla);
      std::vector<std::pair<const TensorView*, const ops::QuantWeight*>> whole = {
          {&a.kv_a_proj_with_mqa, &ql.kv_a_proj}, {&a.o_proj, &ql.o_proj}};
      if (d.q_lora_rank > 0) {
        whole.insert(whole.end(), {{&a.q_a_proj, &ql.q_a_proj}, {&a.q_b_proj, &ql.q_b_proj}});
      } else {
        whole.push_back({&a.q_proj, &ql.q_proj});
      }
      for (auto [w, got] : whole) {
        const Checkpoint::Fp8Source* src = ckpt.fp8_source(*w);
        ASSERT_NE(src, nullptr) << "layer " << l;
        std::vector<float> v = fp8_values(*src);
        EXPECT_TRUE(same_bytes(*got, quantize(r, TensorView(v.data(), DType::kF32, {w->dim(0), w->dim(1)})).q))
            << src->name;
      }
      const Checkpoint::Fp8Source* kvb = ckpt.fp8_source(a.kv_b_proj);
      ASSERT_NE(kvb, nullptr) << "layer " << l;
      const std::vector<float> v = fp8_values(*kvb);
      const int64_t R = d.kv_lora_rank, nope = d.qk_nope_head_dim, vd = d.v_head_dim, per_head = nope + vd;
      for (int64_t h = 0; h < c.num_attention_heads; ++h) {
        std::vector<float> uk = rows_of(v, R, h * per_head, h * per_head + nope, true);
        EXPECT_TRUE(same_bytes(ql.w_uk_t[h], quantize(r, TensorView(uk.data(), DType::kF32, {R, nope})).q))
            << "layer " << l << " head " << h << " W_UK^T";
        std::vector<float> uv = rows_of(v, R, h * per_head + nope, (h + 1) * per_head, false);
        EXPECT_TRUE(same_bytes(ql.w_uv[h], quantize(r, TensorView(uv.data(), DType::kF32, {vd, R})).q))
            << "layer " << l << " head " << h << " W_UV";
        // What the bf16 copy of the same rows would have given.
        const TensorView uv_bf16 =
            TensorView::strided(const_cast<bf16_t*>(a.kv_b_proj.data_as<const bf16_t>()) + (h * per_head + nope) * R,
                                DType::kBF16, {vd, R}, {R, 1});
        const Buffer from_bf16 = quantize(r, uv_bf16);
        uv_matrices_differ += !same_bytes(ql.w_uv[h], from_bf16.q);
        const int64_t n = ql.w_uv[h].data.numel();
        for (int64_t e = 0; e < n; ++e) {
          uv_codes_differ_from_bf16 +=
              ql.w_uv[h].data.data_as<const uint8_t>()[e] != from_bf16.q.data.data_as<const uint8_t>()[e];
        }
        uv_codes += n;
      }
    }
    // The bf16 step changes W8A8 and MXFP8 codes of W_UV (here: not MXFP4's, as for the whole matrices above).
    if (r.scheme != ops::WeightQuantScheme::kMxfp4) {
      EXPECT_GT(uv_matrices_differ, 0);
    }
    std::printf("%s %s: W_UV code bytes that differ from the bf16 path: %lld of %lld (%.2f%%)\n", GetParam(),
                std::string(ops::weight_quant_scheme_name(r.scheme)).c_str(),
                static_cast<long long>(uv_codes_differ_from_bf16), static_cast<long long>(uv_codes),
                100.0 * static_cast<double>(uv_codes_differ_from_bf16) / static_cast<double>(uv_codes));
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, Fp8DirectQuantMla, ::testing::Values("tiny-dsa", "tiny-dsv3-noq"), [](const auto& p) {
  return std::string(p.param) == "tiny-dsa" ? "tiny_dsa" : "tiny_dsv3_noq";
});

TEST(Fp8DirectQuant, row_range_out_of_the_tensor_is_an_error_naming_it) {
  std::vector<uint8_t> codes(4 * 8, 0x38);
  std::vector<float> scale(1, 1.0f), out(4 * 8);
  const TensorView q(codes.data(), DType::kFp8E4M3FN, {4, 8}), s(scale.data(), DType::kF32, {1, 1});
  const Status st = dequantize_fp8_rows_f32(q, s, {}, "m.safetensors", "w.weight", 2, 5, out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "m.safetensors: rows [2, 5) of tensor 'w.weight' [4, 8] are out of range");
  ASSERT_TRUE(dequantize_fp8_rows_f32(q, s, {}, "m.safetensors", "w.weight", 1, 3, out.data()).ok());
  EXPECT_EQ(out[0], 1.0f);  // e4m3 0x38 = 1.0
}

}  // namespace
}  // namespace genbridge::model
