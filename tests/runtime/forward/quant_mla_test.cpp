// Quantized MLA attention projections (DeepSeek presets): --weight-quant quantizes q_a/q_b (or q),
// kv_a, kv_b (in the absorbed form's layout: W_UK^T and W_UV per head) and o; the DSA indexer's projections
// stay bf16 (QuantizedLayers::indexer_projections). The oracle: each quantized matrix equals
// ops::quantize_weight of the bf16 matrix cut out of the checkpoint here (kv_b transposed per head
// independently of the runtime's helper), and the runner uses them (its logits change).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>

#include "runtime/forward/quant_weights.h"
#include "runtime/forward/runner.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

// `w` quantized by the stable op into buffers of the representation's shapes (the oracle).
struct Quantized {
  std::vector<uint8_t> bytes;
  ops::QuantWeight q;
};
Quantized reference_quantize(const runtime::WeightQuantRepresentation& r, const TensorView& w) {
  const int64_t N = w.dim(0), K = w.dim(1);
  const int64_t cols = r.weight_element == DType::kFp4E2M1x2 ? K / 2 : K;
  Quantized out;
  out.bytes.resize(static_cast<size_t>(runtime::quant_weight_bytes(r, N, K)));
  out.q.scheme = r.scheme;
  out.q.in_features = K;
  out.q.data = TensorView(out.bytes.data(), r.weight_element, {N, cols});
  uint8_t* s = out.bytes.data() + N * cols;
  out.q.scale = r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel
                    ? TensorView(s, r.scale_dtype, {N})
                    : TensorView(s, r.scale_dtype, {N, ops::mx_scale_pairs_of(K), 2});
  EXPECT_TRUE(ops::quantize_weight(w, out.q).ok());
  return out;
}

int64_t bytes_of(const TensorView& v) { return v.numel() * static_cast<int64_t>(dtype_size(v.dtype())); }

bool same(const ops::QuantWeight& a, const ops::QuantWeight& b) {
  return a.scheme == b.scheme && a.in_features == b.in_features && a.data.numel() == b.data.numel() &&
         a.data.dim(0) == b.data.dim(0) && a.scale.numel() == b.scale.numel() && a.data.data() && b.data.data() &&
         std::memcmp(a.data.data(), b.data.data(), static_cast<size_t>(bytes_of(a.data))) == 0 &&
         std::memcmp(a.scale.data(), b.scale.data(), static_cast<size_t>(bytes_of(a.scale))) == 0;
}

class QuantMla : public ::testing::TestWithParam<const char*> {};

TEST_P(QuantMla, projections_quantized_in_the_absorbed_layout_indexer_bf16) {
  genbridge::testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint(GetParam(), 5, dir / "m").ok());
  const Checkpoint ckpt = Checkpoint::open(dir / "m").value();
  const ModelConfig& c = ckpt.config();
  const DeepseekConfig& d = c.deepseek;
  const runtime::GenerationContract& contract = runtime::DeviceOperator::create({}).value().contract();
  const runtime::QuantizedLayers& roles = contract.weight_quant.layers;
  ASSERT_TRUE(roles.attention_projections);
  ASSERT_FALSE(roles.indexer_projections);
  for (int i = 0; i < contract.weight_quant.num_offered; ++i) {
    const runtime::WeightQuantRepresentation& r = contract.weight_quant.offered[i];
    SCOPED_TRACE(std::string(ops::weight_quant_scheme_name(r.scheme)));
    auto q = QuantizedWeights::quantize(ckpt, r, roles);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    uint64_t replaced = 0;  // bf16 bytes of every quantized role; the indexer's are not among them
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const LayerWeights& lw = ckpt.weights().layers[static_cast<size_t>(l)];
      const QuantizedWeights::Layer& ql = (*q)->layer(l);
      ASSERT_TRUE(ql.mla) << "layer " << l;
      EXPECT_FALSE(ql.attention);
      const MlaWeights& a = lw.mla;
      if (d.q_lora_rank > 0) {
        EXPECT_TRUE(same(ql.q_a_proj, reference_quantize(r, a.q_a_proj).q)) << "layer " << l;
        EXPECT_TRUE(same(ql.q_b_proj, reference_quantize(r, a.q_b_proj).q)) << "layer " << l;
        replaced += bytes_of(a.q_a_proj) + bytes_of(a.q_b_proj);
      } else {
        EXPECT_TRUE(same(ql.q_proj, reference_quantize(r, a.q_proj).q)) << "layer " << l;
        replaced += bytes_of(a.q_proj);
      }
      EXPECT_TRUE(same(ql.kv_a_proj, reference_quantize(r, a.kv_a_proj_with_mqa).q)) << "layer " << l;
      EXPECT_TRUE(same(ql.o_proj, reference_quantize(r, a.o_proj).q)) << "layer " << l;
      replaced += bytes_of(a.kv_a_proj_with_mqa) + bytes_of(a.o_proj) + bytes_of(a.kv_b_proj);
      ASSERT_EQ(static_cast<int64_t>(ql.w_uk_t.size()), c.num_attention_heads);
      ASSERT_EQ(static_cast<int64_t>(ql.w_uv.size()), c.num_attention_heads);
      const auto* kvb = a.kv_b_proj.data_as<const bf16_t>();
      const int64_t per_head = d.qk_nope_head_dim + d.v_head_dim, R = d.kv_lora_rank;
      for (int64_t h = 0; h < c.num_attention_heads; ++h) {
        // W_UK[h]^T: element (j, i) = kv_b[h * per_head + i, j], j < kv_lora_rank, i < qk_nope_head_dim.
        std::vector<bf16_t> uk(static_cast<size_t>(R * d.qk_nope_head_dim));
        for (int64_t j = 0; j < R; ++j) {
          for (int64_t i = 0; i < d.qk_nope_head_dim; ++i) uk[j * d.qk_nope_head_dim + i] = kvb[(h * per_head + i) * R + j];
        }
        EXPECT_TRUE(same(ql.w_uk_t[h], reference_quantize(r, TensorView(uk.data(), DType::kBF16,
                                                                         {R, d.qk_nope_head_dim})).q))
            << "layer " << l << " head " << h;
        std::vector<bf16_t> uv(kvb + (h * per_head + d.qk_nope_head_dim) * R, kvb + (h + 1) * per_head * R);
        EXPECT_TRUE(same(ql.w_uv[h], reference_quantize(r, TensorView(uv.data(), DType::kBF16, {d.v_head_dim, R})).q))
            << "layer " << l << " head " << h;
      }
      if (lw.is_moe) {
        for (const MlpWeights& m : lw.moe.experts) {
          replaced += bytes_of(m.gate_proj) + bytes_of(m.up_proj) + bytes_of(m.down_proj);
        }
        if (c.deepseek.n_shared_experts > 0) {  // DeepSeek's ungated shared experts are quantized too
          const MlpWeights& m = lw.moe.shared_expert;
          replaced += bytes_of(m.gate_proj) + bytes_of(m.up_proj) + bytes_of(m.down_proj);
        }
      } else {
        replaced += bytes_of(lw.dense.gate_proj) + bytes_of(lw.dense.up_proj) + bytes_of(lw.dense.down_proj);
      }
    }
    EXPECT_EQ((*q)->replaced_bf16_bytes(), replaced);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, QuantMla, ::testing::Values("tiny-dsa", "tiny-dsv3-noq"),
                         [](const auto& p) { return std::string(p.param) == "tiny-dsa" ? "tiny_dsa" : "tiny_dsv3_noq"; });

// The runner computes attention with the quantized MLA projections: its logits differ from those of the same
// weights with the MLA projections left bf16 (experts quantized in both).
TEST(QuantMlaRunner, quantized_projections_are_used) {
  genbridge::testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny-dsa", 5, dir / "m").ok());
  const Checkpoint ckpt = Checkpoint::open(dir / "m").value();
  const ModelConfig& c = ckpt.config();
  runtime::DeviceConfig dc;
  dc.weight_quant = "auto";
  const runtime::DeviceOperator dev = runtime::DeviceOperator::create(dc).value();
  runtime::QuantizedLayers experts_only = dev.contract().weight_quant.layers;
  experts_only.attention_projections = false;
  auto logits = [&](const runtime::QuantizedLayers& roles) {
    auto q = QuantizedWeights::quantize(ckpt, *dev.weight_quant(), roles);
    EXPECT_TRUE(q.ok()) << q.status().to_string();
    auto pool = runtime::KvPagePool::create(dev.kv_page_geometry(kv_model_shape(c)), 2).value();
    auto runner = ModelRunner::create(ckpt, dev, pool, q->get());
    EXPECT_TRUE(runner.ok()) << runner.status().to_string();
    ForwardBatch batch = (*runner)->make_batch(8, 1);
    std::vector<float> out(static_cast<size_t>(c.vocab_size));
    EXPECT_TRUE(pool.admit(1, 8).ok());
    const std::vector<int32_t> tokens = {3, 14, 15, 92, 65, 35, 89, 79};
    const std::vector<runtime::SeqId> ids = {1};
    const std::vector<int32_t> lens = {8};
    EXPECT_TRUE((*runner)->forward(batch, {tokens, ids, lens}, out).ok());
    return out;
  };
  const std::vector<float> all = logits(dev.contract().weight_quant.layers);
  const std::vector<float> experts = logits(experts_only);
  double num = 0, den = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_TRUE(std::isfinite(all[i]));
    num += (all[i] - experts[i]) * (all[i] - experts[i]);
    den += experts[i] * experts[i];
  }
  EXPECT_GT(std::sqrt(num / den), 1e-4) << "the MLA projections' quantization did not change the logits";
  EXPECT_LT(std::sqrt(num / den), 0.5);
}

}  // namespace
}  // namespace genbridge::model
