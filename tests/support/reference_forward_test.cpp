// The fp64 reference forward pass on hand-checkable micro cases (each piece and whole micro models whose
// logits can be worked out on paper), plus properties on the tiny synthetic checkpoint.
#include "support/reference_forward.h"

#include <gtest/gtest.h>

#include <deque>
#include <set>

#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::testing {
namespace {

using model::ModelConfig;
using model::NormType;

constexpr double kTol = 1e-12;

// Owns small f32 tensors for hand-built weights.
class Weights {
 public:
  TensorView f32(std::vector<int64_t> shape, const std::vector<float>& values) {
    store_.emplace_back(DType::kF32, shape);
    TensorView v = store_.back().view();
    EXPECT_EQ(v.numel(), static_cast<int64_t>(values.size()));
    for (size_t i = 0; i < values.size(); ++i) v.data_as<float>()[i] = values[i];
    return v;
  }

 private:
  std::deque<OwnedTensor> store_;
};

TEST(ReferenceForward, rms_and_gemma_norms) {
  Weights w;
  const std::vector<double> x = {3.0, 4.0};
  const double r = std::sqrt(12.5 + 1e-6);
  const std::vector<double> rms = ref_norm(x, w.f32({2}, {1.f, 2.f}), 1e-6, NormType::kRms);
  EXPECT_NEAR(rms[0], 3.0 / r, kTol);
  EXPECT_NEAR(rms[1], 8.0 / r, kTol);
  // Gemma stores w - 1: the same result from weights [0, 1].
  const std::vector<double> gemma = ref_norm(x, w.f32({2}, {0.f, 1.f}), 1e-6, NormType::kGemma);
  EXPECT_NEAR(gemma[0], 3.0 / r, kTol);
  EXPECT_NEAR(gemma[1], 8.0 / r, kTol);
}

TEST(ReferenceForward, neox_rope_rotates_the_two_halves) {
  // head_dim 4, theta 100: pair (0, 2) turns by pos * 1, pair (1, 3) by pos * 100^(-1/2) = pos * 0.1.
  std::vector<double> a = {1, 0, 0, 0}, b = {0, 1, 0, 0}, c = {0.5, -2, 0.25, 7};
  ref_rope_neox(a, 1, 100.0);
  ref_rope_neox(b, 1, 100.0);
  EXPECT_NEAR(a[0], std::cos(1.0), kTol);
  EXPECT_NEAR(a[2], std::sin(1.0), kTol);
  EXPECT_NEAR(a[1], 0.0, kTol);
  EXPECT_NEAR(b[1], std::cos(0.1), kTol);
  EXPECT_NEAR(b[3], std::sin(0.1), kTol);
  std::vector<double> c0 = c;
  ref_rope_neox(c0, 0, 100.0);  // position 0 is the identity
  EXPECT_EQ(c0, c);
  ref_rope_neox(c, 3, 100.0);
  EXPECT_NEAR(c[0] * c[0] + c[2] * c[2], 0.25 + 0.0625, kTol);  // rotations keep each pair's norm
  EXPECT_NEAR(c[1] * c[1] + c[3] * c[3], 4.0 + 49.0, kTol);
}

TEST(ReferenceForward, attention_is_causal_and_weights_by_softmax) {
  // 2 positions, 2 query heads sharing 1 kv head, head_dim 2. k0 = 0, k1 = [1, 0].
  // Head 0 has q = 0 at position 1: uniform over both positions. Head 1 has q = [sqrt(2) ln 3, 0]: scores
  // 0 and ln 3 after the 1/sqrt(2) scale, so weights 1/4 and 3/4.
  const double l3 = std::sqrt(2.0) * std::log(3.0);
  const std::vector<double> q = {5, 5, 5, 5, /*pos 1*/ 0, 0, l3, 0};
  const std::vector<double> k = {0, 0, 1, 0};
  const std::vector<double> v = {1, 2, 10, 20};
  const std::vector<double> o = ref_attention(q, k, v, 2, 2, 1, 2);
  // Position 0 sees only itself, whatever q is.
  EXPECT_NEAR(o[0], 1, kTol);
  EXPECT_NEAR(o[1], 2, kTol);
  EXPECT_NEAR(o[2], 1, kTol);
  EXPECT_NEAR(o[3], 2, kTol);
  EXPECT_NEAR(o[4], 5.5, kTol);
  EXPECT_NEAR(o[5], 11, kTol);
  EXPECT_NEAR(o[6], 0.25 * 1 + 0.75 * 10, kTol);
  EXPECT_NEAR(o[7], 0.25 * 2 + 0.75 * 20, kTol);
}

TEST(ReferenceForward, gqa_maps_query_heads_to_kv_heads_in_groups) {
  // 4 query heads, 2 kv heads, one position: heads 0 and 1 read kv head 0, heads 2 and 3 read kv head 1.
  const std::vector<double> q(8, 0.3), k = {1, 0, 0, 1}, v = {1, 2, 3, 4};
  const std::vector<double> o = ref_attention(q, k, v, 1, 4, 2, 2);
  EXPECT_EQ(o, (std::vector<double>{1, 2, 1, 2, 3, 4, 3, 4}));
}

TEST(ReferenceForward, routing_softmax_topk_and_ties) {
  const RefRouting r = ref_route({1, 3, 3, 0}, 2, true);
  const double z = std::exp(1) + 2 * std::exp(3) + 1;
  EXPECT_NEAR(r.probs[1], std::exp(3) / z, kTol);
  EXPECT_EQ(r.ids, (std::vector<int64_t>{1, 2}));  // equal probabilities: lower id first
  EXPECT_NEAR(r.weights[0], 0.5, kTol);
  EXPECT_NEAR(r.weights[1], 0.5, kTol);
  const RefRouting u = ref_route({1, 3, 3, 0}, 2, false);
  EXPECT_NEAR(u.weights[0], std::exp(3) / z, kTol);
  // A tie at the k-th place goes to the lower expert id.
  EXPECT_EQ(ref_route({2, 1, 1, 0}, 2, true).ids, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(ref_route({0, 0, 0, 0}, 3, true).ids, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ref_route({0, 5, 0, 7}, 1, true).ids, (std::vector<int64_t>{3}));
}

TEST(ReferenceForward, moe_block_weighted_experts_plus_gated_shared_expert) {
  // hidden 1, 3 experts of width 1: expert e computes silu(x) * (e + 1) x; router logits [0, x, 2x].
  Weights w;
  ModelConfig c;
  c.num_experts = 3;
  c.num_experts_per_tok = 2;
  c.norm_topk_prob = true;
  c.shared_expert_intermediate_size = 1;
  model::MoeWeights m;
  m.router = w.f32({3, 1}, {0, 1, 2});
  for (int e = 0; e < 3; ++e) {
    m.experts.push_back({w.f32({1, 1}, {1}), w.f32({1, 1}, {static_cast<float>(e + 1)}), w.f32({1, 1}, {1})});
  }
  m.shared_expert = {w.f32({1, 1}, {1}), w.f32({1, 1}, {1}), w.f32({1, 1}, {2})};
  m.shared_expert_gate = w.f32({1, 1}, {0});  // sigmoid(0) = 1/2
  RefRouting routing;
  const std::vector<double> y = ref_moe(c, m, {1.0}, &routing);
  const double silu1 = 1.0 / (1.0 + std::exp(-1.0));
  EXPECT_EQ(routing.ids, (std::vector<int64_t>{2, 1}));
  const double w2 = std::exp(2) / (std::exp(1) + std::exp(2)), w1 = 1 - w2;
  EXPECT_NEAR(routing.weights[0], w2, kTol);
  EXPECT_NEAR(y[0], silu1 * (3 * w2 + 2 * w1) + 0.5 * 2 * silu1, kTol);
}

// A one-layer dense model with hidden 2, one head of dim 2 and vocab 3, every weight chosen so the logits
// can be worked out by hand: q = k = 0 (uniform causal attention), v = o = identity, MLP = 0.
struct MicroModel {
  Weights w;
  ModelConfig c;
  model::ModelWeights mw;

  explicit MicroModel(NormType norm) {
    c.vocab_size = 3;
    c.hidden_size = 2;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 1;
    c.num_key_value_heads = 1;
    c.head_dim = 2;
    c.rms_norm_eps = 1e-300;  // negligible: results are pure ratios
    c.rope_theta = 10000;
    c.num_experts = 0;
    c.intermediate_size = 1;
    c.norm_type = norm;
    const float one = norm == NormType::kGemma ? 0.f : 1.f;  // the weight meaning "scale by 1"
    mw.embed_tokens = w.f32({3, 2}, {3, 4, 0, 2, 1, 1});
    model::LayerWeights l;
    l.input_layernorm = w.f32({2}, {one, one});
    l.post_attention_layernorm = w.f32({2}, {one, one});
    l.attn.q_proj = w.f32({2, 2}, {0, 0, 0, 0});
    l.attn.k_proj = w.f32({2, 2}, {0, 0, 0, 0});
    l.attn.v_proj = w.f32({2, 2}, {1, 0, 0, 1});
    l.attn.o_proj = w.f32({2, 2}, {1, 0, 0, 1});
    l.attn.q_norm = w.f32({2}, {one, one});
    l.attn.k_norm = w.f32({2}, {one, one});
    l.dense = {w.f32({1, 2}, {0, 0}), w.f32({1, 2}, {0, 0}), w.f32({2, 1}, {0, 0})};
    mw.layers.push_back(l);
    mw.final_norm = w.f32({2}, {one, one});
    mw.lm_head = w.f32({3, 2}, {1, 0, 0, 1, 1, 1});
  }
};

std::vector<double> unit_rms(std::vector<double> x) {
  const double r = std::sqrt((x[0] * x[0] + x[1] * x[1]) / 2);
  return {x[0] / r, x[1] / r};
}

TEST(ReferenceForward, micro_model_logits_by_hand) {
  for (NormType norm : {NormType::kRms, NormType::kGemma}) {
    MicroModel m(norm);
    const ReferenceForward r = reference_forward(m.c, m.mw, std::vector<int32_t>{0, 1});
    ASSERT_EQ(r.logits.size(), 6u);
    // Position 0: attention returns v0 = unit_rms(e0), h = e0 + unit_rms(e0) is parallel to e0, so the final
    // norm gives unit_rms(e0) = [3, 4] / sqrt(12.5), and the LM head rows are [1,0], [0,1], [1,1].
    const std::vector<double> n0 = unit_rms({3, 4});
    EXPECT_NEAR(r.logit(0, 0), n0[0], kTol);
    EXPECT_NEAR(r.logit(0, 1), n0[1], kTol);
    EXPECT_NEAR(r.logit(0, 2), n0[0] + n0[1], kTol);
    // Position 1: uniform attention over both positions: h = e1 + (unit_rms(e0) + unit_rms(e1)) / 2.
    const std::vector<double> n1 = unit_rms({0, 2});
    const std::vector<double> f = unit_rms({0 + (n0[0] + n1[0]) / 2, 2 + (n0[1] + n1[1]) / 2});
    EXPECT_NEAR(r.logit(1, 0), f[0], kTol);
    EXPECT_NEAR(r.logit(1, 1), f[1], kTol);
    EXPECT_NEAR(r.logit(1, 2), f[0] + f[1], kTol);
    EXPECT_TRUE(r.topk_ids[0].empty());  // dense layer: no routing
    EXPECT_EQ(r.residual_rms[0].size(), 2u);
  }
}

TEST(ReferenceForward, micro_moe_model_exposes_routing) {
  MicroModel m(NormType::kRms);
  m.c.num_experts = 2;
  m.c.num_experts_per_tok = 1;
  m.c.moe_intermediate_size = 1;
  m.c.norm_topk_prob = true;  // top-1 renormalised: weight exactly 1
  model::LayerWeights& l = m.mw.layers[0];
  l.is_moe = true;
  // Router logits = [x0, x1] of the normed hidden state: token 0 ([3, 4]) picks expert 1, token 2 ([1, 1])
  // ties and picks expert 0. Experts output zero, so the logits equal the dense micro model's.
  l.moe.router = m.w.f32({2, 2}, {1, 0, 0, 1});
  for (int e = 0; e < 2; ++e) {
    l.moe.experts.push_back({m.w.f32({1, 2}, {0, 0}), m.w.f32({1, 2}, {0, 0}), m.w.f32({2, 1}, {0, 0})});
  }
  const ReferenceForward r = reference_forward(m.c, m.mw, std::vector<int32_t>{0, 2});
  // Position 1's hidden state: e2 + (v0 + v2)/2 with v = unit_rms(e): [1 + 1.1243, 1 + 1.2657] -> expert 1.
  EXPECT_EQ(r.topk_ids[0], (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(r.topk_weights[0], (std::vector<double>{1.0, 1.0}));
  ASSERT_EQ(r.router_probs[0].size(), 4u);
  EXPECT_NEAR(r.router_probs[0][1], 1.0 / (1.0 + std::exp(-(0.8 - 0.6) * std::sqrt(2.0))), kTol);
  m.c.norm_topk_prob = false;  // weights are then the chosen probabilities themselves
  const ReferenceForward raw = reference_forward(m.c, m.mw, std::vector<int32_t>{0, 2});
  EXPECT_EQ(raw.topk_weights[0][0], raw.router_probs[0][1]);
  EXPECT_EQ(raw.topk_weights[0][1], raw.router_probs[0][3]);
  // Margin: log(p_1 / p_2) is the router logit gap, (0.8 - 0.6) * sqrt(2) at position 0.
  EXPECT_NEAR(r.topk_margin[0][0], 0.2 * std::sqrt(2.0), kTol);
  const ReferenceForward tie = reference_forward(m.c, m.mw, std::vector<int32_t>{2});
  EXPECT_EQ(tie.topk_ids[0], (std::vector<int64_t>{0}));
  EXPECT_EQ(tie.topk_margin[0][0], 0.0);  // an exact tie: either expert is a correct choice
}

TEST(ReferenceForward, rejects_out_of_range_tokens) {
  MicroModel m(NormType::kRms);
  EXPECT_THROW(reference_forward(m.c, m.mw, std::vector<int32_t>{0, 3}), std::invalid_argument);
  EXPECT_THROW(reference_forward(m.c, m.mw, std::vector<int32_t>{-1}), std::invalid_argument);
}

class ReferenceOnTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 0, dir_->path()).ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::vector<int32_t> prompt(size_t n) {
    std::vector<int32_t> t;
    for (size_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 97 + 13) % 512));
    return t;
  }
  static TempDir* dir_;
};
TempDir* ReferenceOnTiny::dir_ = nullptr;

TEST_F(ReferenceOnTiny, later_tokens_do_not_change_earlier_logits) {
  const model::Checkpoint ck = model::Checkpoint::open(dir_->path()).value();
  const std::vector<int32_t> t = prompt(12);
  const ReferenceForward full = reference_forward(ck.config(), ck.weights(), t);
  const ReferenceForward head = reference_forward(ck.config(), ck.weights(), std::span(t).first(5));
  EXPECT_EQ(std::vector<double>(full.logits.begin(), full.logits.begin() + 5 * 512), head.logits);
  EXPECT_EQ(std::vector<int64_t>(full.topk_ids[0].begin(), full.topk_ids[0].begin() + 10), head.topk_ids[0]);
}

TEST_F(ReferenceOnTiny, activations_and_routing_are_sane) {
  const model::Checkpoint ck = model::Checkpoint::open(dir_->path()).value();
  const ModelConfig& c = ck.config();
  const int64_t n = 32;
  const ReferenceForward r = reference_forward(c, ck.weights(), prompt(n));
  for (double v : r.logits) ASSERT_TRUE(std::isfinite(v));
  for (int64_t p = 0; p < n; ++p) {
    double ss = 0;
    for (double v : r.logits_at(p)) ss += v * v;
    const double std = std::sqrt(ss / 512);
    EXPECT_GT(std, 0.3) << p;  // logits neither collapsed...
    EXPECT_LT(std, 3.0) << p;  // ...nor saturated
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (double rms : r.residual_rms[l]) {
      EXPECT_GT(rms, 0.5) << l;
      EXPECT_LT(rms, 10.0) << l;
    }
    if (!c.is_moe_layer(l)) continue;
    // Routing is spread: most experts are chosen by some token, none by every token.
    std::map<int64_t, int> count;
    for (int64_t e : r.topk_ids[l]) ++count[e];
    EXPECT_GE(count.size(), 6u) << l;
    for (const auto& [e, k] : count) EXPECT_LT(k, n) << l << " expert " << e;
    // Top-k weights are renormalised (norm_topk_prob) and ordered.
    for (int64_t p = 0; p < n; ++p) {
      EXPECT_NEAR(r.topk_weights[l][p * 2] + r.topk_weights[l][p * 2 + 1], 1.0, 1e-12);
      EXPECT_GE(r.topk_weights[l][p * 2], r.topk_weights[l][p * 2 + 1]);
    }
  }
}

TEST_F(ReferenceOnTiny, native_and_bf16_precision_read_the_same_values) {
  const model::Checkpoint a = model::Checkpoint::open(dir_->path()).value();
  const model::Checkpoint b =
      model::Checkpoint::open(dir_->path(), {.precision = model::WeightPrecision::kNative}).value();
  const std::vector<int32_t> t = prompt(4);
  EXPECT_EQ(reference_forward(a.config(), a.weights(), t).logits, reference_forward(b.config(), b.weights(), t).logits);
}

TEST(ReferenceOnTinyGemma, tied_gemma_model_runs_and_is_deterministic) {
  TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint("tiny-gemma", 0, dir.path()).ok());
  const model::Checkpoint ck = model::Checkpoint::open(dir.path()).value();
  const std::vector<int32_t> t = {1, 2, 3, 500, 7, 7, 7};
  const ReferenceForward a = reference_forward(ck.config(), ck.weights(), t);
  const ReferenceForward b = reference_forward(ck.config(), ck.weights(), t);
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_TRUE(a.topk_ids[0].empty());  // layer 0 dense (sparse step 2)
  EXPECT_EQ(a.topk_ids[1].size(), t.size() * 2);
  for (double v : a.logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace genbridge::testing
