// The DeepSeek fp64 reference forward (the engine's oracle) and the runtime's YaRN helpers: YaRN's inverse
// frequencies and softmax-scale correction on hand-computed values, the two RoPE forms, and properties of the
// reference on the tiny DeepSeek checkpoints (causality, indexer selection sizes, sparse == dense while the
// context fits index_topk, routing structure).
#include "support/deepseek_reference_forward.h"

#include <gtest/gtest.h>

#include <set>

#include "runtime/forward/deepseek_rope.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::testing {
namespace {

using model::ModelConfig;

TEST(DeepseekYarn, inverse_frequencies_follow_the_correction_ramp) {
  // tiny-dsa: rope dim 64, theta 1e4, factor 4, original context 1024, beta 32 / 1. The correction range:
  // 64 ln(1024 / (2 pi 32)) / (2 ln 1e4) = 5.65 -> low 5; 64 ln(1024 / (2 pi)) / (2 ln 1e4) = 17.70 -> high 18.
  const ModelConfig c = model::synthetic_preset_config("tiny-dsa").value();
  const std::vector<double> runtime = model::deepseek_rope_inv_freq(c), ref = ds_ref_inv_freq(c);
  ASSERT_EQ(runtime.size(), 32u);
  ASSERT_EQ(ref.size(), 32u);
  for (int64_t i = 0; i < 32; ++i) {
    const double base = std::pow(1e4, -2.0 * static_cast<double>(i) / 64.0);
    const double ramp = std::clamp((static_cast<double>(i) - 5.0) / 13.0, 0.0, 1.0);
    const double want = base * (1.0 - ramp) + base / 4.0 * ramp;
    EXPECT_NEAR(runtime[i], want, 1e-15 * want) << i;
    EXPECT_NEAR(ref[i], want, 1e-15 * want) << i;
    if (i <= 5) {
      EXPECT_NEAR(runtime[i], base, 1e-15 * base) << "extrapolated (kept) " << i;
    }
    if (i >= 18) {
      EXPECT_NEAR(runtime[i], base / 4.0, 1e-15 * base) << "interpolated " << i;
    }
  }
  // Without YaRN: plain theta^(-2i/d).
  const ModelConfig plain = model::synthetic_preset_config("tiny-dsv3-noq").value();
  EXPECT_DOUBLE_EQ(model::deepseek_rope_inv_freq(plain)[7], std::pow(1e4, -14.0 / 64.0));
}

TEST(DeepseekYarn, softmax_scale_correction) {
  const ModelConfig c = model::synthetic_preset_config("tiny-dsa").value();
  const double m = 0.1 * std::log(4.0) + 1.0;  // mscale_all_dim 1, factor 4
  EXPECT_NEAR(model::mla_softmax_scale(c), m * m / std::sqrt(128.0), 1e-15);
  EXPECT_NEAR(ds_ref_softmax_scale(c), m * m / std::sqrt(128.0), 1e-15);
  EXPECT_DOUBLE_EQ(model::yarn_get_mscale(1.0, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(model::mla_softmax_scale(model::synthetic_preset_config("tiny-dsv3-noq").value()),
                   1.0 / std::sqrt(128.0));
  EXPECT_DOUBLE_EQ(model::indexer_weight_scale(c), 1.0 / std::sqrt(4.0) / std::sqrt(128.0));
}

TEST(DeepseekYarn, interleaved_and_half_split_rope_forms) {
  const ModelConfig c = model::synthetic_preset_config("tiny-dsa").value();
  const std::vector<double> f = ds_ref_inv_freq(c);
  const model::RopeTables tables = model::make_rope_tables(c, 300);
  // Interleaved: a unit vector on dim 2i turns within (2i, 2i+1); half-split: within (i, i + 32).
  std::vector<double> a(64, 0.0), b(64, 0.0);
  a[6] = 1.0;
  b[3] = 1.0;
  ds_ref_rope(a, f, 257, true);
  ds_ref_rope(b, f, 257, false);
  EXPECT_NEAR(a[6], std::cos(257 * f[3]), 1e-12);
  EXPECT_NEAR(a[7], std::sin(257 * f[3]), 1e-12);
  EXPECT_NEAR(b[3], std::cos(257 * f[3]), 1e-12);
  EXPECT_NEAR(b[35], std::sin(257 * f[3]), 1e-12);
  // The runtime's fp32 rotations agree with the fp64 ones.
  for (bool interleaved : {true, false}) {
    std::vector<double> x(64);
    std::vector<float> xf(64);
    for (int i = 0; i < 64; ++i) xf[i] = static_cast<float>(x[i] = std::sin(0.37 * i + 1.0));
    ds_ref_rope(x, f, 199, interleaved);
    if (interleaved) {
      model::rope_interleaved(tables, 199, xf);
    } else {
      model::rope_half_split(tables, 199, xf);
    }
    for (int i = 0; i < 64; ++i) EXPECT_NEAR(xf[i], x[i], 2e-6) << (interleaved ? "interleaved " : "split ") << i;
  }
}

class DeepseekReferenceModel : public ::testing::Test {
 protected:
  model::Checkpoint open(const std::string& preset) {
    const std::filesystem::path d = dir_.path() / preset;
    EXPECT_TRUE(model::write_synthetic_checkpoint(preset, 5, d).ok());
    model::LoadOptions o;
    o.precision = model::WeightPrecision::kNative;
    return model::Checkpoint::open(d, o).value();
  }
  static std::vector<int32_t> tokens(int64_t n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 131 + 7) % 509);
    return t;
  }
  TempDir dir_;
};

TEST_F(DeepseekReferenceModel, indexer_selects_min_topk_context_and_is_dense_until_the_context_exceeds_it) {
  const model::Checkpoint ck = open("tiny-dsa");
  const ModelConfig& c = ck.config();
  const std::vector<int32_t> t = tokens(72);  // index_topk 64: the last 8 positions select
  const DeepseekReference sparse = deepseek_reference_forward(c, ck.weights(), t);
  const DeepseekReference dense = deepseek_reference_forward(c, ck.weights(), t, /*index_topk_override=*/1000);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ASSERT_EQ(sparse.index_selected[l].size(), 72u);
    for (int64_t p = 0; p < 72; ++p) {
      const std::vector<int64_t>& sel = sparse.index_selected[l][p];
      EXPECT_EQ(static_cast<int64_t>(sel.size()), std::min<int64_t>(64, p + 1));
      EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
      EXPECT_EQ(std::set<int64_t>(sel.begin(), sel.end()).size(), sel.size());
      EXPECT_LE(sel.back(), p) << "causal";
      EXPECT_EQ(std::isinf(sparse.index_margin[l][p]), p < 64);
    }
  }
  // Exactly the dense result while every position is selected; different afterwards.
  for (int64_t p = 0; p < 64; ++p) {
    for (int64_t v = 0; v < c.vocab_size; ++v) ASSERT_EQ(sparse.logit(p, v), dense.logit(p, v)) << p;
  }
  double diff = 0;
  for (int64_t v = 0; v < c.vocab_size; ++v) diff = std::max(diff, std::abs(sparse.logit(71, v) - dense.logit(71, v)));
  EXPECT_GT(diff, 1e-6) << "sparse selection changed nothing at position 71";
}

TEST_F(DeepseekReferenceModel, causal_prefix_and_grouped_routing_structure) {
  for (const char* preset : {"tiny-dsv3", "tiny-dsv3-noq"}) {
    const model::Checkpoint ck = open(preset);
    const ModelConfig& c = ck.config();
    const std::vector<int32_t> t = tokens(20);
    const DeepseekReference all = deepseek_reference_forward(c, ck.weights(), t);
    const DeepseekReference prefix = deepseek_reference_forward(c, ck.weights(), std::span(t).first(9));
    for (int64_t p = 0; p < 9; ++p) {
      for (int64_t v = 0; v < c.vocab_size; ++v) ASSERT_EQ(prefix.logit(p, v), all.logit(p, v)) << preset;
    }
    const int64_t k = c.num_experts_per_tok, gs = c.num_experts / c.deepseek.n_group;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      EXPECT_EQ(all.topk_ids[l].empty(), !c.is_moe_layer(l)) << preset << " layer " << l;
      for (int64_t p = 0; p < static_cast<int64_t>(all.topk_margin[l].size()); ++p) {
        std::set<int64_t> ids, groups;
        double sum = 0;
        for (int64_t j = 0; j < k; ++j) {
          ids.insert(all.topk_ids[l][p * k + j]);
          groups.insert(all.topk_ids[l][p * k + j] / gs);
          sum += all.topk_weights[l][p * k + j];
        }
        EXPECT_EQ(static_cast<int64_t>(ids.size()), k);
        EXPECT_LE(static_cast<int64_t>(groups.size()), c.deepseek.topk_group);
        if (c.norm_topk_prob) {
          EXPECT_NEAR(sum, c.deepseek.routed_scaling_factor, 1e-12);
        }
      }
    }
    // Activations stay O(1) and logits are spread (the synthetic scales keep the model non-degenerate).
    for (double rms : all.residual_rms.back()) EXPECT_LT(rms, 20.0);
    double lo = 1e300, hi = -1e300;
    for (double v : all.logits_at(19)) lo = std::min(lo, v), hi = std::max(hi, v);
    EXPECT_GT(hi - lo, 1.0) << preset;
  }
}

}  // namespace
}  // namespace genbridge::testing
