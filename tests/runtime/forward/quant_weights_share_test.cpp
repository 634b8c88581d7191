// Quantizing a share of a model's weights (AFD under mpirun): an attention rank quantizes only the
// attention side, an FFN rank only the routed experts it owns. A share holds exactly the bits of the same
// matrices quantized with the whole model (each matrix is quantized alone), holds nothing else, costs less,
// and a runner or expert bank asked for weights outside the share says so instead of using bf16 weights.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "runtime/forward/quant_weights.h"
#include "runtime/forward/runner.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

bool same_bytes(const TensorView& a, const TensorView& b) {
  if (a.dtype() != b.dtype() || a.numel() != b.numel() || a.data() == nullptr || b.data() == nullptr) return false;
  return std::memcmp(a.data(), b.data(), static_cast<size_t>(a.numel()) * dtype_size(a.dtype())) == 0;
}

bool same_weight(const ops::QuantWeight& a, const ops::QuantWeight& b) {
  return a.scheme == b.scheme && a.in_features == b.in_features && same_bytes(a.data, b.data) &&
         same_bytes(a.scale, b.scale);
}

bool same_expert(const ops::QuantExpertWeights& a, const ops::QuantExpertWeights& b) {
  return same_weight(a.w_gate, b.w_gate) && same_weight(a.w_up, b.w_up) && same_weight(a.w_down, b.w_down);
}

struct Fixture {
  testing::TempDir dir;
  std::optional<Checkpoint> ckpt;
  std::optional<runtime::DeviceOperator> dev;
  std::unique_ptr<QuantizedWeights> all;
  Fixture() {
    EXPECT_TRUE(write_synthetic_checkpoint("tiny", 3, dir / "m").ok());  // 8 experts, a dense layer, shared expert
    ckpt.emplace(Checkpoint::open(dir / "m").value());
    runtime::DeviceConfig dc;
    dc.weight_quant = "auto";
    dev.emplace(runtime::DeviceOperator::create(dc).value());
    all = QuantizedWeights::quantize(*ckpt, *dev->weight_quant(), roles()).value();
  }
  const runtime::QuantizedLayers& roles() const { return dev->contract().weight_quant.layers; }
};

TEST(QuantWeightsShare, ffn_rank_share_holds_its_experts_with_the_bits_of_the_whole_model) {
  Fixture f;
  QuantizeOptions share;
  share.attention = false;
  share.expert_begin = 2;
  share.expert_end = 6;
  auto q = QuantizedWeights::quantize(*f.ckpt, *f.dev->weight_quant(), f.roles(), share);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const QuantizedWeights& s = **q;
  EXPECT_FALSE(s.holds_attention_side());
  EXPECT_EQ(s.expert_begin(), 2);
  EXPECT_EQ(s.expert_end(), 6);
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const QuantizedWeights::Layer& a = f.all->layer(l);
    const QuantizedWeights::Layer& b = s.layer(l);
    EXPECT_FALSE(b.attention || b.shared || b.dense) << "layer " << l;
    if (a.experts.empty()) {
      EXPECT_TRUE(b.experts.empty()) << "layer " << l;
      continue;
    }
    ++moe_layers;
    ASSERT_EQ(b.experts.size(), a.experts.size());
    for (size_t e = 0; e < a.experts.size(); ++e) {
      if (e >= 2 && e < 6) {
        EXPECT_TRUE(same_expert(a.experts[e], b.experts[e])) << "layer " << l << " expert " << e;
      } else {
        EXPECT_EQ(b.experts[e].w_gate.data.data(), nullptr) << "layer " << l << " expert " << e << " is not owned";
      }
    }
  }
  ASSERT_GT(moe_layers, 0);
  EXPECT_EQ(s.num_matrices(), moe_layers * 4 * 3);
  EXPECT_LT(s.quantized_bytes(), f.all->quantized_bytes() / 2);
  EXPECT_NE(s.describe().find("for routed experts [2, 6) of 8 (" + std::to_string(moe_layers * 12) + " matrices"),
            std::string::npos)
      << s.describe();

  // The bank of this share computes its experts, and refuses others rather than using bf16 weights.
  const ExpertBank bank(*f.ckpt, &s);
  const int64_t H = f.ckpt->config().hidden_size, k = f.ckpt->config().num_experts_per_tok;
  int64_t moe = 0;
  while (!f.ckpt->config().is_moe_layer(moe)) ++moe;
  std::vector<bf16_t> x(static_cast<size_t>(H), float_to_bf16(0.5f)), out(static_cast<size_t>(k * H));
  std::vector<int32_t> ids(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) ids[j] = static_cast<int32_t>(2 + j);
  const TensorView xv(x.data(), DType::kBF16, {1, H}), iv(ids.data(), DType::kI32, {1, k}),
      ov(out.data(), DType::kBF16, {1, k, H});
  EXPECT_TRUE(bank.compute(moe, xv, iv, 2, 6, ov).ok());
  const Status st = bank.compute(moe, xv, iv, 0, 8, ov);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "experts: layer " + std::to_string(moe) +
                              "'s experts [0, 8) are not among the quantized experts [2, 6) these weights hold");

  // A runner (the attention side) cannot run on an FFN rank's share.
  const model::ModelConfig& c = f.ckpt->config();
  auto pool =
      runtime::KvPagePool::create(f.dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 2);
  ASSERT_TRUE(pool.ok());
  auto r = ModelRunner::create(*f.ckpt, *f.dev, *pool, &s);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "model runner: the quantized weights hold only routed experts [2, 6) (an FFN rank's share), not the "
            "attention side the runner computes");
}

TEST(QuantWeightsShare, attention_rank_share_holds_the_attention_side_only) {
  Fixture f;
  QuantizeOptions share;
  share.experts = false;
  auto q = QuantizedWeights::quantize(*f.ckpt, *f.dev->weight_quant(), f.roles(), share);
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  const QuantizedWeights& s = **q;
  EXPECT_TRUE(s.holds_attention_side());
  EXPECT_EQ(s.expert_end() - s.expert_begin(), 0);
  bool shared = false, dense = false;
  for (int64_t l = 0; l < s.num_layers(); ++l) {
    const QuantizedWeights::Layer& a = f.all->layer(l);
    const QuantizedWeights::Layer& b = s.layer(l);
    EXPECT_TRUE(b.experts.empty()) << "layer " << l;
    ASSERT_EQ(a.attention, b.attention);
    if (a.attention) {
      EXPECT_TRUE(same_weight(a.q_proj, b.q_proj) && same_weight(a.k_proj, b.k_proj) &&
                  same_weight(a.v_proj, b.v_proj) && same_weight(a.o_proj, b.o_proj))
          << "layer " << l;
    }
    ASSERT_EQ(a.shared, b.shared);
    if (a.shared) {
      EXPECT_TRUE(same_expert(a.shared_expert, b.shared_expert)) << "layer " << l;
    }
    ASSERT_EQ(a.dense, b.dense);
    if (a.dense) {
      EXPECT_TRUE(same_expert(a.dense_mlp, b.dense_mlp)) << "layer " << l;
    }
    shared |= b.shared;
    dense |= b.dense;
  }
  EXPECT_TRUE(shared && dense);  // the tiny preset has both: the test covers them
  // The attention side and two FFN ranks' shares add up to the whole model, matrices and bytes.
  uint64_t bytes = s.quantized_bytes(), replaced = s.replaced_bf16_bytes();
  int64_t matrices = s.num_matrices();
  for (int64_t b : {0, 4}) {
    QuantizeOptions ffn;
    ffn.attention = false;
    ffn.expert_begin = b;
    ffn.expert_end = b + 4;
    auto e = QuantizedWeights::quantize(*f.ckpt, *f.dev->weight_quant(), f.roles(), ffn);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    bytes += (*e)->quantized_bytes();
    replaced += (*e)->replaced_bf16_bytes();
    matrices += (*e)->num_matrices();
  }
  EXPECT_EQ(bytes, f.all->quantized_bytes());
  EXPECT_EQ(replaced, f.all->replaced_bf16_bytes());
  EXPECT_EQ(matrices, f.all->num_matrices());
  // The attention side's runner starts; its experts are not held (an AFD attention rank never computes them).
  const model::ModelConfig& c = f.ckpt->config();
  auto pool =
      runtime::KvPagePool::create(f.dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 2);
  ASSERT_TRUE(pool.ok());
  auto r = ModelRunner::create(*f.ckpt, *f.dev, *pool, &s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
}

TEST(QuantWeightsShare, expert_range_outside_the_model_is_an_error) {
  Fixture f;
  QuantizeOptions share;
  share.expert_begin = 4;
  share.expert_end = 9;
  auto q = QuantizedWeights::quantize(*f.ckpt, *f.dev->weight_quant(), f.roles(), share);
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(q.status().message(), "quantize weights: the expert range [4, 9) is not inside the model's 8 experts");
}

}  // namespace
}  // namespace genbridge::model
