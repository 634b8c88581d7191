// Which matrices --weight-quant quantizes, counted per role for each architecture (Qwen3-MoE, DeepSeek-V3,
// DeepSeek-V3.2, Qwen3.5-MoE: its full-attention layers' projections, not the Gated DeltaNet's; DeepSeek-V4: not its
// compressors' nor its indexer's) and each scheme the build's generation offers: attention projections (GQA q/k/v/o;
// MLA q_a/q_b or q, kv_a, o and kv_b as W_UK^T + W_UV per head; V4 wq_a, wq_b, wkv, wo_a per output group, wo_b),
// routed experts, shared experts (Qwen's gated shared_expert, DeepSeek's ungated shared_experts) and dense MLPs, as
// docs/quant_weights.md states. The expected counts come from the config alone; the runner uses the quantized
// DeepSeek shared experts, and an AFD attention rank's share holds them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "runtime/forward/deepseek_attention.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/forward/runner.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

struct RoleCounts {
  int64_t attention = 0, routed = 0, shared = 0, dense = 0;
  int64_t total() const { return attention + routed + shared + dense; }
};

// What the documented roles give for `c`, from the config only.
RoleCounts expected_counts(const ModelConfig& c, bool attention_side, bool experts) {
  RoleCounts n;
  const bool deepseek = c.is_deepseek();
  const bool has_shared = deepseek             ? c.deepseek.n_shared_experts > 0
                          : c.is_deepseek_v4() ? c.dsv4.n_shared_experts > 0
                                               : c.shared_expert_intermediate_size > 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (attention_side && c.is_deepseek_v4()) {
      n.attention += 4 + c.dsv4.o_groups;                  // wq_a, wq_b, wkv, wo_b and wo_a per group
    } else if (attention_side && !c.is_linear_layer(l)) {  // Qwen3.5's Gated DeltaNet projections stay bf16
      n.attention += deepseek ? (c.deepseek.q_lora_rank > 0 ? 2 : 1) + 2 + 2 * c.num_attention_heads : 4;
    }
    if (c.is_moe_layer(l)) {
      if (experts) n.routed += 3 * c.num_experts;
      if (attention_side && has_shared) n.shared += 3;
    } else if (attention_side) {
      n.dense += 3;
    }
  }
  return n;
}

// What `q` holds, matrix by matrix.
RoleCounts held_counts(const QuantizedWeights& q) {
  RoleCounts n;
  const auto set = [](const ops::QuantWeight& w) -> int64_t { return w.data.data() != nullptr; };
  const auto mlp = [&](const ops::QuantExpertWeights& e) { return set(e.w_gate) + set(e.w_up) + set(e.w_down); };
  for (int64_t l = 0; l < q.num_layers(); ++l) {
    const QuantizedWeights::Layer& ql = q.layer(l);
    n.attention += set(ql.q_proj) + set(ql.k_proj) + set(ql.v_proj) + set(ql.o_proj) + set(ql.q_a_proj) +
                   set(ql.q_b_proj) + set(ql.kv_a_proj);
    for (const ops::QuantWeight& w : ql.w_uk_t) n.attention += set(w);
    for (const ops::QuantWeight& w : ql.w_uv) n.attention += set(w);
    n.attention += set(ql.wq_a) + set(ql.wq_b) + set(ql.wkv) + set(ql.wo_b);
    for (const ops::QuantWeight& w : ql.wo_a) n.attention += set(w);
    for (const ops::QuantExpertWeights& e : ql.experts) n.routed += mlp(e);
    if (ql.shared) n.shared += mlp(ql.shared_expert);
    if (ql.dense) n.dense += mlp(ql.dense_mlp);
  }
  return n;
}

bool same_as_stable_op(const runtime::WeightQuantRepresentation& r, const TensorView& w, const ops::QuantWeight& got) {
  const int64_t N = w.dim(0), K = w.dim(1);
  const int64_t cols = r.weight_element == DType::kFp4E2M1x2 ? K / 2 : K;
  std::vector<uint8_t> bytes(static_cast<size_t>(runtime::quant_weight_bytes(r, N, K)));
  ops::QuantWeight want;
  want.scheme = r.scheme;
  want.in_features = K;
  want.data = TensorView(bytes.data(), r.weight_element, {N, cols});
  uint8_t* s = bytes.data() + N * cols;
  want.scale = r.granularity == runtime::WeightScaleGranularity::kPerOutputChannel
                   ? TensorView(s, r.scale_dtype, {N})
                   : TensorView(s, r.scale_dtype, {N, ops::mx_scale_pairs_of(K), 2});
  if (!ops::quantize_weight(w, want).ok() || got.data.data() == nullptr) return false;
  const size_t data_bytes = static_cast<size_t>(N * cols) * dtype_size(r.weight_element);
  const size_t scale_bytes = static_cast<size_t>(want.scale.numel()) * dtype_size(r.scale_dtype);
  return got.data.numel() == want.data.numel() && got.scale.numel() == want.scale.numel() &&
         std::memcmp(got.data.data(), want.data.data(), data_bytes) == 0 &&
         std::memcmp(got.scale.data(), want.scale.data(), scale_bytes) == 0;
}

class QuantRoles : public ::testing::TestWithParam<const char*> {};

TEST_P(QuantRoles, matrices_per_role_for_every_scheme) {
  genbridge::testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint(GetParam(), 3, dir / "m").ok());
  const Checkpoint ckpt = Checkpoint::open(dir / "m").value();
  const ModelConfig& c = ckpt.config();
  const runtime::GenerationContract& contract = runtime::DeviceOperator::create({}).value().contract();
  const runtime::QuantizedLayers& roles = contract.weight_quant.layers;
  ASSERT_TRUE(roles.attention_projections && roles.experts && roles.shared_experts);
  const RoleCounts want = expected_counts(c, true, true);
  ASSERT_GT(want.routed, 0);
  for (int i = 0; i < contract.weight_quant.num_offered; ++i) {
    const runtime::WeightQuantRepresentation& r = contract.weight_quant.offered[i];
    const std::string scheme(ops::weight_quant_scheme_name(r.scheme));
    SCOPED_TRACE(scheme);
    auto q = QuantizedWeights::quantize(ckpt, r, roles);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    const RoleCounts got = held_counts(**q);
    EXPECT_EQ(got.attention, want.attention);
    EXPECT_EQ(got.routed, want.routed);
    EXPECT_EQ(got.shared, want.shared);
    EXPECT_EQ(got.dense, want.dense);
    EXPECT_EQ((*q)->num_matrices(), want.total());
    EXPECT_NE((*q)->describe().find("(" + std::to_string(want.total()) + " matrices"), std::string::npos)
        << (*q)->describe();
    // The shared experts hold the stable op's bits of the checkpoint's shared-expert weights.
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const QuantizedWeights::Layer& ql = (*q)->layer(l);
      if (!ql.shared) continue;
      const MlpWeights& m = ckpt.weights().layers[static_cast<size_t>(l)].moe.shared_expert;
      EXPECT_TRUE(same_as_stable_op(r, m.gate_proj, ql.shared_expert.w_gate)) << "layer " << l;
      EXPECT_TRUE(same_as_stable_op(r, m.up_proj, ql.shared_expert.w_up)) << "layer " << l;
      EXPECT_TRUE(same_as_stable_op(r, m.down_proj, ql.shared_expert.w_down)) << "layer " << l;
    }
    std::printf("%s %s: %lld matrices: attention %lld, routed experts %lld, shared experts %lld, dense MLPs %lld\n",
                GetParam(), scheme.c_str(), static_cast<long long>(got.total()), static_cast<long long>(got.attention),
                static_cast<long long>(got.routed), static_cast<long long>(got.shared),
                static_cast<long long>(got.dense));
  }
}

// An AFD attention rank's share holds the shared experts with the whole model's bits; an FFN rank's none.
TEST_P(QuantRoles, afd_shares_split_the_roles) {
  genbridge::testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint(GetParam(), 3, dir / "m").ok());
  const Checkpoint ckpt = Checkpoint::open(dir / "m").value();
  const ModelConfig& c = ckpt.config();
  const runtime::GenerationContract& contract = runtime::DeviceOperator::create({}).value().contract();
  const runtime::WeightQuantRepresentation& r = contract.weight_quant.offered[0];
  QuantizeOptions attention, ffn;
  attention.experts = false;
  ffn.attention = false;
  auto a = QuantizedWeights::quantize(ckpt, r, contract.weight_quant.layers, attention);
  auto f = QuantizedWeights::quantize(ckpt, r, contract.weight_quant.layers, ffn);
  ASSERT_TRUE(a.ok() && f.ok());
  const RoleCounts ga = held_counts(**a), gf = held_counts(**f);
  const RoleCounts wa = expected_counts(c, true, false), wf = expected_counts(c, false, true);
  EXPECT_EQ(ga.attention, wa.attention);
  EXPECT_EQ(ga.shared, wa.shared);
  EXPECT_EQ(ga.dense, wa.dense);
  EXPECT_EQ(ga.routed, 0);
  EXPECT_EQ(gf.routed, wf.routed);
  EXPECT_EQ(gf.attention + gf.shared + gf.dense, 0);
  EXPECT_EQ((*a)->num_matrices() + (*f)->num_matrices(), expected_counts(c, true, true).total());
}

INSTANTIATE_TEST_SUITE_P(Architectures, QuantRoles,
                         ::testing::Values("tiny", "tiny-dsv3", "tiny-dsa", "tiny-dsv3-noq", "tiny-qwen35",
                                           "tiny-dsv4"),
                         [](const auto& p) {
                           std::string s = p.param;
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s;
                         });

// The runner computes DeepSeek's shared experts with their quantized weights: on a model whose every layer
// is MoE with a shared expert (no dense MLP shares the shared_experts role), quantizing that role changes
// the logits.
TEST(QuantRolesRunner, deepseek_shared_experts_run_quantized) {
  ModelConfig c = synthetic_preset_config("tiny-dsv3").value();
  c.deepseek.first_k_dense_replace = 0;
  ASSERT_GT(c.deepseek.n_shared_experts, 0);
  genbridge::testing::TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint(c, 5, dir / "m").ok());
  const Checkpoint ckpt = Checkpoint::open(dir / "m").value();
  runtime::DeviceConfig dc;
  dc.weight_quant = "auto";
  const runtime::DeviceOperator dev = runtime::DeviceOperator::create(dc).value();
  runtime::QuantizedLayers no_shared = dev.contract().weight_quant.layers;
  no_shared.shared_experts = false;
  auto logits = [&](const runtime::QuantizedLayers& roles) {
    auto q = QuantizedWeights::quantize(ckpt, *dev.weight_quant(), roles);
    EXPECT_TRUE(q.ok()) << q.status().to_string();
    auto pool = runtime::KvPagePool::create(dev.kv_page_geometry(kv_model_shape(ckpt.config())), 2).value();
    auto runner = ModelRunner::create(ckpt, dev, pool, q->get());
    EXPECT_TRUE(runner.ok()) << runner.status().to_string();
    ForwardBatch batch = (*runner)->make_batch(8, 1);
    std::vector<float> out(static_cast<size_t>(ckpt.config().vocab_size));
    EXPECT_TRUE(pool.admit(1, 8).ok());
    const std::vector<int32_t> tokens = {3, 14, 15, 92, 65, 35, 89, 79};
    const std::vector<runtime::SeqId> ids = {1};
    const std::vector<int32_t> lens = {8};
    EXPECT_TRUE((*runner)->forward(batch, {tokens, ids, lens}, out).ok());
    return out;
  };
  const std::vector<float> all = logits(dev.contract().weight_quant.layers);
  const std::vector<float> bf16_shared = logits(no_shared);
  double num = 0, den = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_TRUE(std::isfinite(all[i]));
    num += (all[i] - bf16_shared[i]) * (all[i] - bf16_shared[i]);
    den += bf16_shared[i] * bf16_shared[i];
  }
  EXPECT_GT(std::sqrt(num / den), 1e-4) << "the shared experts' quantization did not change the logits";
  EXPECT_LT(std::sqrt(num / den), 0.5);
}

}  // namespace
}  // namespace genbridge::model
