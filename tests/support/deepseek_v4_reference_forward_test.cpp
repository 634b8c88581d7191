// The DeepSeek-V4 fp64 reference forward (the oracle of the engine's V4 forward): its pieces on hand-computed
// values (YaRN on compressed layers only, interleaved RoPE and its inverse, the hyper-connection weights and
// Sinkhorn, sink attention, window pooling with overlap, the SwiGLU clamp) and properties of the whole model a
// wrong formula would break (causality, the sliding window's reach, when a compressed entry becomes visible,
// the indexer's top-k, relative positions only, hash routing by the table, the grouped output projection),
// on small random models built in memory.
#include "support/deepseek_v4_reference_forward.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <set>

namespace genbridge::testing {
namespace {

using model::ModelConfig;

// The shape of an in-memory model; the defaults are the tiny model of the 2,000-token test.
struct TinyV4Shape {
  std::vector<int64_t> ratios{0, 4, 128, 4};  // compress ratio per layer
  int64_t hidden = 128, heads = 4, head_dim = 512, rope = 64, q_lora = 64, o_groups = 2, o_lora = 64;
  int64_t window = 128, vocab = 256, experts = 8, topk = 2, moe_width = 64, shared = 1;
  int64_t index_heads = 4, index_dim = 64, index_topk = 8;
  int64_t hash_layers = 1, hc = 4, sinkhorn = 20;
  double swiglu_limit = 10.0;
};

// A random DeepSeek-V4 model whose weights live in buffers it owns (bf16, and fp32 where the checkpoints keep
// fp32: hyper-connections, sinks, ape, the routing bias). Each tensor's values depend only on the seed and
// its creation index, so two shapes that differ in one tensor share every other.
class TinyV4 {
 public:
  TinyV4(const TinyV4Shape& s, uint64_t seed) : seed_(seed) {
    c.architecture = model::Architecture::kDeepseekV4;
    c.vocab_size = s.vocab;
    c.hidden_size = s.hidden;
    c.num_hidden_layers = static_cast<int64_t>(s.ratios.size());
    c.num_attention_heads = s.heads;
    c.num_key_value_heads = 1;
    c.head_dim = s.head_dim;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    c.max_position_embeddings = 1 << 20;
    c.num_experts = s.experts;
    c.num_experts_per_tok = s.topk;
    c.moe_intermediate_size = s.moe_width;
    c.norm_topk_prob = true;
    model::DeepseekV4Config& v = c.dsv4;
    v.compress_ratios = s.ratios;
    v.compress_ratios.push_back(0);  // the MTP layer's
    v.q_lora_rank = s.q_lora;
    v.qk_rope_head_dim = s.rope;
    v.o_groups = s.o_groups;
    v.o_lora_rank = s.o_lora;
    v.sliding_window = s.window;
    v.compress_rope_theta = 160000.0;
    v.yarn = true;
    v.rope_scaling.factor = 16.0;
    v.rope_scaling.original_max_position_embeddings = 65536;
    v.index_n_heads = s.index_heads;
    v.index_head_dim = s.index_dim;
    v.index_topk = s.index_topk;
    v.n_shared_experts = s.shared;
    v.routed_scaling_factor = 1.5;
    v.num_hash_layers = s.hash_layers;
    v.swiglu_limit = s.swiglu_limit;
    v.hc_mult = s.hc;
    v.hc_sinkhorn_iters = s.sinkhorn;
    v.hc_eps = 1e-6;

    const int64_t H = s.hidden, D = s.head_dim, n = s.hc, E = s.experts;
    auto linear = [&](int64_t out, int64_t in) {
      const float b = std::sqrt(3.0f / static_cast<float>(in));  // unit-variance outputs for unit-variance inputs
      return make(DType::kBF16, {out, in}, -b, b);
    };
    auto norm = [&](int64_t dim) { return make(DType::kBF16, {dim}, 0.8f, 1.2f); };
    auto hc_site = [&](int64_t rows) {
      return model::HyperConnectionWeights{make(DType::kF32, {rows, n * H}, -0.05f, 0.05f),
                                           make(DType::kF32, {rows}, -0.5f, 0.5f),
                                           make(DType::kF32, {rows == n ? 1 : 3}, 0.5f, 1.5f)};
    };
    auto compressor = [&](int64_t ratio, int64_t width) {
      const int64_t coff = ratio == 4 ? 2 : 1;
      model::V4CompressorWeights cw;
      cw.wkv = linear(coff * width, H);
      cw.wgate = linear(coff * width, H);
      cw.ape = make(DType::kF32, {ratio, coff * width}, -1.0f, 1.0f);
      cw.norm = norm(width);
      return cw;
    };
    auto mlp = [&](int64_t width) {
      model::MlpWeights m;
      m.gate_proj = linear(width, H);
      m.up_proj = linear(width, H);
      m.down_proj = linear(H, width);
      return m;
    };
    w.embed_tokens = make(DType::kBF16, {s.vocab, H}, -1.0f, 1.0f);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      model::LayerWeights lw;
      lw.input_layernorm = norm(H);
      lw.post_attention_layernorm = norm(H);
      model::V4AttentionWeights& a = lw.v4;
      a.wq_a = linear(s.q_lora, H);
      a.q_norm = norm(s.q_lora);
      a.wq_b = linear(s.heads * D, s.q_lora);
      a.wkv = linear(D, H);
      a.kv_norm = norm(D);
      a.wo_a = linear(s.o_groups * s.o_lora, s.heads * D / s.o_groups);
      a.wo_b = linear(H, s.o_groups * s.o_lora);
      a.attn_sink = make(DType::kF32, {s.heads}, -1.0f, 1.0f);
      const int64_t ratio = s.ratios[static_cast<size_t>(l)];
      if (ratio > 0) a.compressor = compressor(ratio, D);
      if (ratio == 4) {
        a.index_wq_b = linear(s.index_heads * s.index_dim, s.q_lora);
        a.index_weights_proj = linear(s.index_heads, H);
        a.index_compressor = compressor(4, s.index_dim);
      }
      lw.hc_attn = hc_site((2 + n) * n);
      lw.hc_ffn = hc_site((2 + n) * n);
      lw.is_moe = true;
      lw.moe.router = linear(E, H);
      if (l < s.hash_layers) {
        owned_.push_back(std::make_unique<OwnedTensor>(DType::kI64, std::vector<int64_t>{s.vocab, s.topk}));
        lw.tid2eid = owned_.back()->view();
        std::mt19937_64 rng(seed_ + 1000003 * static_cast<uint64_t>(l));
        for (int64_t t = 0; t < s.vocab; ++t) {  // s.topk distinct experts per token, in a random order
          std::vector<int64_t> ids(static_cast<size_t>(E));
          std::iota(ids.begin(), ids.end(), 0);
          std::shuffle(ids.begin(), ids.end(), rng);
          for (int64_t j = 0; j < s.topk; ++j) lw.tid2eid.data_as<int64_t>()[t * s.topk + j] = ids[j];
        }
      } else {
        lw.moe.e_score_correction_bias = make(DType::kF32, {E}, -0.1f, 0.1f);
      }
      for (int64_t e = 0; e < E; ++e) lw.moe.experts.push_back(mlp(s.moe_width));
      if (s.shared > 0) lw.moe.shared_expert = mlp(s.shared * s.moe_width);
      w.layers.push_back(lw);
    }
    w.final_norm = norm(H);
    w.lm_head = linear(s.vocab, H);
    w.hc_head = hc_site(n);
  }
  TinyV4(const TinyV4&) = delete;
  TinyV4& operator=(const TinyV4&) = delete;

  DeepseekV4Reference run(std::span<const int32_t> tokens) const { return deepseek_v4_reference_forward(c, w, tokens); }

  ModelConfig c;
  model::ModelWeights w;

 private:
  TensorView make(DType dtype, std::vector<int64_t> shape, float lo, float hi) {
    owned_.push_back(std::make_unique<OwnedTensor>(dtype, std::move(shape)));
    const TensorView t = owned_.back()->view();
    fill_uniform(t, seed_ + 7919 * owned_.size(), lo, hi);
    return t;
  }
  uint64_t seed_;
  std::vector<std::unique_ptr<OwnedTensor>> owned_;
};

std::vector<int32_t> tokens(int64_t n, int64_t vocab, uint64_t seed = 3) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& v : t) v = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

bool same_logits(const DeepseekV4Reference& a, const DeepseekV4Reference& b, int64_t pa, int64_t pb) {
  const std::span<const double> x = a.logits_at(pa), y = b.logits_at(pb);
  return std::equal(x.begin(), x.end(), y.begin());
}

double max_abs_diff(std::span<const double> x, std::span<const double> y) {
  double d = 0.0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::abs(x[i] - y[i]));
  return d;
}

// A shape that runs in milliseconds: every layer kind, short windows.
TinyV4Shape small_shape(std::vector<int64_t> ratios, int64_t window) {
  TinyV4Shape s;
  s.ratios = std::move(ratios);
  s.window = window;
  s.hidden = 64;
  s.heads = 2;
  s.vocab = 64;
  return s;
}

TEST(DeepseekV4ReferenceRope, yarn_scales_only_the_compressed_layers) {
  // Rope dim 64, compress_rope_theta 1.6e5, factor 16, original context 65536, beta 32 / 1: the correction
  // range is 64 ln(65536 / (2 pi 32)) / (2 ln 1.6e5) = 15.45 -> low 15 and 64 ln(65536 / 2 pi) / (2 ln 1.6e5)
  // = 24.71 -> high 25.
  const TinyV4 m(small_shape({0, 4}, 8), 1);
  const std::vector<double> compressed = v4_ref_inv_freq(m.c, true), plain = v4_ref_inv_freq(m.c, false);
  ASSERT_EQ(compressed.size(), 32u);
  ASSERT_EQ(plain.size(), 32u);
  for (int64_t i = 0; i < 32; ++i) {
    const double base = std::pow(160000.0, -2.0 * static_cast<double>(i) / 64.0);
    const double ramp = std::clamp((static_cast<double>(i) - 15.0) / 10.0, 0.0, 1.0);
    EXPECT_NEAR(compressed[i], base * (1.0 - ramp) + base / 16.0 * ramp, 1e-15 * base) << i;
    EXPECT_NEAR(plain[i], std::pow(10000.0, -2.0 * static_cast<double>(i) / 64.0), 1e-15) << "no YaRN, theta 1e4 " << i;
  }
  EXPECT_DOUBLE_EQ(compressed[3], std::pow(160000.0, -6.0 / 64.0)) << "kept below the range";
  EXPECT_DOUBLE_EQ(compressed[30], std::pow(160000.0, -60.0 / 64.0) / 16.0) << "interpolated above it";
}

TEST(DeepseekV4ReferenceRope, rotates_trailing_interleaved_pairs_and_the_inverse_undoes_it) {
  const std::vector<double> f{0.5, 0.25};  // two pairs: the last four dims of six
  std::vector<double> x{7.0, 8.0, 0.0, 0.0, 1.0, 0.0};
  v4_ref_rope(x, f, 3);
  EXPECT_EQ(x[0], 7.0);
  EXPECT_EQ(x[1], 8.0);
  EXPECT_EQ(x[2], 0.0);
  EXPECT_EQ(x[3], 0.0);
  EXPECT_NEAR(x[4], std::cos(0.75), 1e-15);
  EXPECT_NEAR(x[5], std::sin(0.75), 1e-15);
  v4_ref_rope(x, f, 3, /*inverse=*/true);
  EXPECT_NEAR(x[4], 1.0, 1e-15);
  EXPECT_NEAR(x[5], 0.0, 1e-15);
}

TEST(DeepseekV4ReferenceHyperConnection, sinkhorn_makes_comb_doubly_stochastic) {
  const TinyV4 m(small_shape({0}, 8), 2);
  const int64_t n = m.c.dsv4.hc_mult, H = m.c.hidden_size;
  const V4RefHcSite site = v4_ref_hc_site(m.w.layers[0].hc_attn, n, H, "hc_attn");
  std::vector<double> x(static_cast<size_t>(n * H));
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal(0.0, 2.0);
  for (double& v : x) v = normal(rng);
  for (int64_t iters : {20, 1}) {
    const V4RefHcMix h = v4_ref_hc_mix(site, x, n, 1e-6, 1e-6, iters);
    double row_err = 0.0, col_err = 0.0;
    for (int64_t a = 0; a < n; ++a) {
      double row = 0.0, col = 0.0;
      for (int64_t b = 0; b < n; ++b) {
        EXPECT_GT(h.comb[a * n + b], 0.0);
        row += h.comb[a * n + b];
        col += h.comb[b * n + a];
      }
      row_err = std::max(row_err, std::abs(row - 1.0));
      col_err = std::max(col_err, std::abs(col - 1.0));
    }
    EXPECT_LT(col_err, 1e-5) << iters << " iterations end on the columns";
    if (iters == 20) {
      EXPECT_LT(row_err, 1e-5);
    } else {
      EXPECT_GT(row_err, 1e-3) << "one column pass alone leaves the rows unbalanced";
    }
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_GT(h.pre[j], 0.0);
      EXPECT_LT(h.pre[j], 1.0 + 2e-6);
      EXPECT_GT(h.post[j], 0.0);
      EXPECT_LT(h.post[j], 2.0);
    }
  }
}

TEST(DeepseekV4ReferenceHyperConnection, zero_projection_leaves_the_base_terms) {
  // fn = 0: pre = sigmoid(base) + eps, post = 2 sigmoid(base), comb = Sinkhorn(softmax(base rows) + eps).
  const int64_t n = 2;
  V4RefHcSite site;
  site.fn.rows = (2 + n) * n;
  site.fn.cols = n * 3;
  site.fn.v.assign(static_cast<size_t>(site.fn.rows * site.fn.cols), 0.0);
  site.base = {0.5, -1.0, 2.0, 0.0, std::log(3.0), 0.0, 0.0, 0.0};
  site.scale = {1.0, 1.0, 1.0};
  const std::vector<double> x{1, 2, 3, 4, 5, 6};
  const double eps = 1e-6;
  const V4RefHcMix h = v4_ref_hc_mix(site, x, n, 1e-6, eps, 20);
  EXPECT_DOUBLE_EQ(h.pre[0], 1.0 / (1.0 + std::exp(-0.5)) + eps);
  EXPECT_DOUBLE_EQ(h.pre[1], 1.0 / (1.0 + std::exp(1.0)) + eps);
  EXPECT_DOUBLE_EQ(h.post[0], 2.0 / (1.0 + std::exp(-2.0)));
  EXPECT_DOUBLE_EQ(h.post[1], 1.0);
  // Rows softmax(ln 3, 0) = (3/4, 1/4) and (1/2, 1/2): scaling rows and columns keeps the cross ratio
  // c00 c11 / (c01 c10) = 3, so the doubly stochastic limit (up to eps) is [[a, 1 - a], [1 - a, a]] with
  // a^2 / (1 - a)^2 = 3.
  const double a = std::sqrt(3.0) / (1.0 + std::sqrt(3.0));
  EXPECT_NEAR(h.comb[0], a, 1e-5);
  EXPECT_NEAR(h.comb[1], 1.0 - a, 1e-5);
  EXPECT_NEAR(h.comb[2], 1.0 - a, 1e-5);
  EXPECT_NEAR(h.comb[3], a, 1e-5);
}

TEST(DeepseekV4ReferenceHyperConnection, expand_sums_comb_over_its_first_index) {
  V4RefHcMix h;
  h.post = {0.0, 2.0};
  h.comb = {0.0, 1.0, 0.25, 0.0};               // comb[0][1] = 1: stream 0 feeds stream 1; comb[1][0]: stream 1 feeds 0
  std::vector<double> x{1.0, 2.0, 10.0, 20.0};  // X_0 = (1, 2), X_1 = (10, 20)
  v4_ref_hc_expand(h, std::vector<double>{100.0, 200.0}, x);
  EXPECT_EQ(x, (std::vector<double>{2.5, 5.0, 201.0, 402.0}));
  EXPECT_EQ(v4_ref_hc_collapse(std::vector<double>{0.5, 1.0}, std::vector<double>{1, 2, 10, 20}, 2),
            (std::vector<double>{10.5, 21.0}));
}

TEST(DeepseekV4ReferenceAttention, sink_takes_probability_mass_and_adds_no_value) {
  const std::vector<double> q{1.0, 0.0}, k0{2.0, 1.0}, k1{0.0, 3.0};
  const std::vector<const double*> kv{k0.data(), k1.data()};
  const double e0 = std::exp(0.5 * 2.0), e1 = std::exp(0.0), es = std::exp(0.7);
  const std::vector<double> o = v4_ref_sink_attention(q, kv, 0.5, 0.7);
  EXPECT_NEAR(o[0], (e0 * 2.0 + e1 * 0.0) / (e0 + e1 + es), 1e-15);
  EXPECT_NEAR(o[1], (e0 * 1.0 + e1 * 3.0) / (e0 + e1 + es), 1e-15);
  // A very negative sink leaves the plain softmax; no keys leave zero.
  const std::vector<double> plain = v4_ref_sink_attention(q, kv, 0.5, -1e4);
  EXPECT_NEAR(plain[1], (e0 * 1.0 + e1 * 3.0) / (e0 + e1), 1e-15);
  EXPECT_EQ(v4_ref_sink_attention(q, std::vector<const double*>{}, 0.5, 0.7), (std::vector<double>{0.0, 0.0}));
}

TEST(DeepseekV4ReferenceAttention, inverse_rope_leaves_only_relative_positions) {
  // A query at t against keys (K = V) at positions p_j: rotating everything by the same shift leaves the
  // output once the inverse RoPE at t is applied; without it the output turns with the shift.
  const int64_t d = 16;
  const std::vector<double> f{1.0, 0.3, 0.05, 0.01};
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> q(d);
  for (double& v : q) v = u(rng);
  std::vector<std::vector<double>> keys(5, std::vector<double>(d));
  for (auto& k : keys) {
    for (double& v : k) v = u(rng);
  }
  const std::vector<int64_t> pos{0, 3, 4, 9, 10};
  auto attend = [&](int64_t shift, bool inverse) {
    std::vector<double> qt = q;
    v4_ref_rope(qt, f, 10 + shift);
    std::vector<std::vector<double>> kr = keys;
    std::vector<const double*> ptr;
    for (size_t j = 0; j < kr.size(); ++j) {
      v4_ref_rope(kr[j], f, pos[j] + shift);
      ptr.push_back(kr[j].data());
    }
    std::vector<double> o = v4_ref_sink_attention(qt, ptr, 0.25, 0.1);
    if (inverse) v4_ref_rope(o, f, 10 + shift, true);
    return o;
  };
  for (int64_t shift : {1, 37, 1000}) {
    EXPECT_LT(max_abs_diff(attend(0, true), attend(shift, true)), 1e-12) << shift;
    EXPECT_GT(max_abs_diff(attend(0, false), attend(shift, false)), 1e-3) << shift;
  }
}

TEST(DeepseekV4ReferenceCompressor, pools_per_channel_over_the_window_and_the_overlap) {
  // Width 1: token t's kv is [a_t | b_t] with overlap (first half: the next window's slots), b_t without.
  V4RefCompressor csa;
  csa.ratio = 2;
  csa.width = 1;
  csa.overlap = true;
  csa.ape = {2, 2, std::vector<double>(4, 0.0)};
  std::vector<std::vector<double>> kv{{1, 10}, {2, 20}, {3, 30}, {4, 40}}, zero(4, {0.0, 0.0});
  EXPECT_DOUBLE_EQ(v4_ref_pool_window(csa, kv, zero, 0)[0], 15.0) << "window 0: its own b slots only";
  EXPECT_DOUBLE_EQ(v4_ref_pool_window(csa, kv, zero, 1)[0], (1 + 2 + 30 + 40) / 4.0) << "a of window 0, b of 1";
  // A score (or ape) of +inf-like size picks its slot alone; ape is indexed by the slot within the window.
  std::vector<std::vector<double>> score = zero;
  score[1][0] = 500.0;  // token 1's a slot, which window 1 reads
  EXPECT_DOUBLE_EQ(v4_ref_pool_window(csa, kv, score, 1)[0], 2.0);
  csa.ape.v = {0.0, 0.0, 0.0, 500.0};  // slot 1's b channel
  EXPECT_DOUBLE_EQ(v4_ref_pool_window(csa, kv, zero, 1)[0], 40.0);

  V4RefCompressor hca;
  hca.ratio = 2;
  hca.width = 2;
  hca.ape = {2, 2, std::vector<double>(4, 0.0)};
  hca.ape.v[1] = std::log(3.0);  // slot 0, channel 1: weight 3 : 1
  const std::vector<double> e = v4_ref_pool_window(hca, kv, zero, 1);
  EXPECT_DOUBLE_EQ(e[0], 3.5);
  EXPECT_NEAR(e[1], (3 * 30 + 40) / 4.0, 1e-13);
}

TEST(DeepseekV4ReferenceSwiglu, clamps_the_gate_above_and_the_up_projection_both_ways) {
  V4RefMlp e{{2, 1, {20.0, -30.0}}, {2, 1, {-30.0, 30.0}}, {1, 2, {1.0, 1.0}}};
  const std::vector<double> x{1.0};
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  EXPECT_DOUBLE_EQ(v4_ref_swiglu(e, x, 10.0)[0], silu(10.0) * -10.0 + silu(-30.0) * 10.0);
  EXPECT_DOUBLE_EQ(v4_ref_swiglu(e, x, 0.0)[0], silu(20.0) * -30.0 + silu(-30.0) * 30.0) << "limit 0: no clamp";
}

TEST(DeepseekV4ReferenceModel, causal_and_prefix_consistent) {
  const TinyV4 m(small_shape({0, 4, 16, 4}, 16), 11);
  const std::vector<int32_t> t = tokens(90, m.c.vocab_size);
  const DeepseekV4Reference all = m.run(t);
  const DeepseekV4Reference prefix = m.run(std::span(t).first(45));
  std::vector<int32_t> changed = t;
  changed[60] = (changed[60] + 1) % static_cast<int32_t>(m.c.vocab_size);
  const DeepseekV4Reference later = m.run(changed);
  ASSERT_EQ(all.logits.size(), 90u * 64u);
  for (int64_t p = 0; p < 45; ++p) EXPECT_TRUE(same_logits(all, prefix, p, p)) << p;
  for (int64_t p = 0; p < 60; ++p) EXPECT_TRUE(same_logits(all, later, p, p)) << p;
  EXPECT_FALSE(same_logits(all, later, 60, 60));
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(all.index_selected[l].empty(), l != 1 && l != 3) << l;
    for (int64_t p = 0; p < 45; ++p) EXPECT_EQ(all.experts[l][p], prefix.experts[l][p]);
  }
}

TEST(DeepseekV4ReferenceModel, sliding_window_reaches_exactly_window_tokens_back) {
  const int64_t W = 16, q = 10;
  const TinyV4 m(small_shape({0}, W), 12);
  const std::vector<int32_t> t = tokens(48, m.c.vocab_size);
  std::vector<int32_t> changed = t;
  changed[q] = (changed[q] + 5) % static_cast<int32_t>(m.c.vocab_size);
  const DeepseekV4Reference a = m.run(t), b = m.run(changed);
  for (int64_t p = 0; p < 48; ++p) {
    EXPECT_EQ(same_logits(a, b, p, p), p < q || p >= q + W) << "position " << p << " sees [p - W + 1, p]";
  }
}

TEST(DeepseekV4ReferenceModel, compressed_entry_is_invisible_until_its_window_completes) {
  // One layer, a window of 2 tokens: a token reaches queries more than 2 positions later only through the
  // compressed entry of its window, which query t sees once t + 1 >= m (w + 1).
  for (const int64_t m : {4, 16}) {
    TinyV4Shape s = small_shape({m}, 2);
    s.index_topk = 1000;  // every visible entry kept
    const TinyV4 model(s, 13);
    const int64_t w = 2, q = m * w, n = m * (w + 2);
    const std::vector<int32_t> t = tokens(n, model.c.vocab_size);
    std::vector<int32_t> changed = t;
    changed[q] = (changed[q] + 7) % static_cast<int32_t>(model.c.vocab_size);  // the first token of window w
    const DeepseekV4Reference a = model.run(t), b = model.run(changed);
    for (int64_t p = 0; p < n; ++p) {
      const bool in_window = p >= q && p < q + 2, entry_visible = p + 1 >= m * (w + 1);
      EXPECT_EQ(same_logits(a, b, p, p), !in_window && !entry_visible) << "ratio " << m << " position " << p;
    }
  }
}

TEST(DeepseekV4ReferenceModel, indexer_keeps_the_top_k_visible_entries_and_is_dense_while_they_fit) {
  TinyV4Shape s = small_shape({4}, 4);
  s.index_topk = 3;
  const TinyV4 sparse_model(s, 14);
  s.index_topk = 1000;
  const TinyV4 dense_model(s, 14);
  const std::vector<int32_t> t = tokens(64, s.vocab);
  const DeepseekV4Reference sparse = sparse_model.run(t), dense = dense_model.run(t);
  ASSERT_EQ(sparse.index_selected[0].size(), 64u);
  for (int64_t p = 0; p < 64; ++p) {
    const std::vector<int64_t>& sel = sparse.index_selected[0][p];
    const int64_t visible = (p + 1) / 4;
    EXPECT_EQ(static_cast<int64_t>(sel.size()), std::min<int64_t>(3, visible)) << p;
    EXPECT_TRUE(std::is_sorted(sel.begin(), sel.end()));
    EXPECT_EQ(std::set<int64_t>(sel.begin(), sel.end()).size(), sel.size());
    if (!sel.empty()) {
      EXPECT_LT(sel.back(), visible) << "causal";
    }
    EXPECT_EQ(std::isinf(sparse.index_margin[0][p]), visible <= 3) << p;
    if (visible > 3) {
      EXPECT_GE(sparse.index_margin[0][p], 0.0);
    }
    EXPECT_EQ(dense.index_selected[0][p].size(), static_cast<size_t>(visible));
    // Bitwise the dense result while every visible entry is kept.
    if (visible <= 3) {
      EXPECT_TRUE(same_logits(sparse, dense, p, p)) << p;
    }
  }
  EXPECT_GT(max_abs_diff(sparse.logits_at(63), dense.logits_at(63)), 1e-9) << "the selection changed nothing";
}

TEST(DeepseekV4ReferenceModel, sliding_window_layers_see_relative_positions_only) {
  // Two sliding-window layers of window 8: a position 14 or more tokens in depends on the last 15 tokens
  // only, whatever its absolute position: shifting the sequence right by 13 filler tokens leaves its logits
  // (up to rounding of the rotations). Without the inverse RoPE on the output this fails.
  const TinyV4 m(small_shape({0, 0}, 8), 15);
  const std::vector<int32_t> a = tokens(40, m.c.vocab_size);
  std::vector<int32_t> b = tokens(13, m.c.vocab_size, 99);
  b.insert(b.end(), a.begin(), a.end());
  const DeepseekV4Reference ra = m.run(a), rb = m.run(b);
  for (int64_t p = 0; p < 40; ++p) {
    const double diff = max_abs_diff(ra.logits_at(p), rb.logits_at(p + 13));
    if (p >= 14) {
      EXPECT_LT(diff, 1e-9) << p;
    } else {
      EXPECT_GT(diff, 1e-6) << p << " sees filler tokens";
    }
  }
}

TEST(DeepseekV4ReferenceModel, each_layer_kind_rotates_with_its_own_rope) {
  // Sliding-window layers: rope_theta, never YaRN. Compressed layers (ratio 4 and others): compress_rope_theta
  // with YaRN, for their keys, queries, entries and the indexer alike.
  for (const int64_t ratio : {0, 4, 16}) {
    TinyV4 m(small_shape({ratio}, 8), 20);
    const std::vector<int32_t> t = tokens(40, m.c.vocab_size);
    const DeepseekV4Reference base = m.run(t);
    m.c.rope_theta = 5000.0;
    const DeepseekV4Reference main_theta = m.run(t);
    m.c.rope_theta = 10000.0;
    m.c.dsv4.compress_rope_theta = 80000.0;
    const DeepseekV4Reference compress_theta = m.run(t);
    m.c.dsv4.compress_rope_theta = 160000.0;
    m.c.dsv4.yarn = false;
    const DeepseekV4Reference no_yarn = m.run(t);
    EXPECT_EQ(base.logits == main_theta.logits, ratio != 0) << ratio;
    EXPECT_EQ(base.logits == compress_theta.logits, ratio == 0) << ratio;
    EXPECT_EQ(base.logits == no_yarn.logits, ratio == 0) << ratio;
  }
}

TEST(DeepseekV4ReferenceModel, hash_layers_route_by_the_table) {
  const TinyV4 m(small_shape({0, 0}, 8), 16);
  const std::vector<int32_t> t = tokens(30, m.c.vocab_size);
  const DeepseekV4Reference r = m.run(t);
  const int64_t k = m.c.num_experts_per_tok;
  const TensorView table = m.w.layers[0].tid2eid;
  for (int64_t p = 0; p < 30; ++p) {
    const std::vector<int64_t> row(table.data_as<const int64_t>() + t[p] * k,
                                   table.data_as<const int64_t>() + (t[p] + 1) * k);
    EXPECT_EQ(r.experts[0][p], row) << "hash layer, in the table's order";
    EXPECT_TRUE(std::isinf(r.expert_margin[0][p]));
    EXPECT_EQ(r.experts[1][p].size(), static_cast<size_t>(k));
    EXPECT_EQ(std::set<int64_t>(r.experts[1][p].begin(), r.experts[1][p].end()).size(), static_cast<size_t>(k));
    EXPECT_GE(r.expert_margin[1][p], 0.0);
    EXPECT_FALSE(std::isinf(r.expert_margin[1][p]));
  }
  // Rewriting the table row of a token first seen at position p0 changes the logits from p0 on.
  int64_t p0 = 5;
  while (std::find(t.begin(), t.begin() + p0, t[p0]) != t.begin() + p0) ++p0;
  ASSERT_LT(p0, 30);
  const int32_t tok = t[p0];
  int64_t* row = table.data_as<int64_t>() + tok * k;
  const std::vector<int64_t> saved(row, row + k);
  for (int64_t j = 0; j < k; ++j) row[j] = (saved[j] + 1) % m.c.num_experts;
  std::set<int64_t> distinct(row, row + k);
  ASSERT_EQ(distinct.size(), static_cast<size_t>(k));
  const DeepseekV4Reference moved = m.run(t);
  std::copy(saved.begin(), saved.end(), row);
  for (int64_t p = 0; p < p0; ++p) EXPECT_TRUE(same_logits(r, moved, p, p)) << p;
  EXPECT_FALSE(same_logits(r, moved, p0, p0));
  EXPECT_NE(moved.experts[0][p0], r.experts[0][p0]);
}

TEST(DeepseekV4ReferenceModel, grouped_output_equals_one_group_with_a_block_diagonal_wo_a) {
  // Group g (heads [g nh / G, (g + 1) nh / G)) meets wo_a rows [g r, (g + 1) r) only: two groups of rank r are
  // one group of rank 2 r whose wo_a holds the two blocks on its diagonal.
  TinyV4Shape s = small_shape({0, 4}, 8);
  const TinyV4 grouped(s, 17);
  s.o_groups = 1;
  s.o_lora = 2 * 64;
  const TinyV4 single(s, 17);
  const int64_t r = 64, gw = s.heads * s.head_dim / 2;
  for (int64_t l = 0; l < 2; ++l) {
    const TensorView src = grouped.w.layers[l].v4.wo_a, dst = single.w.layers[l].v4.wo_a;
    ASSERT_EQ(dst.dim(0), 2 * r);
    ASSERT_EQ(dst.dim(1), 2 * gw);
    for (int64_t row = 0; row < 2 * r; ++row) {
      for (int64_t col = 0; col < 2 * gw; ++col) {
        const bool block = (row < r) == (col < gw);
        const double value = block ? element_as_double(src, row * gw + col % gw) : 0.0;
        set_element(dst, row * 2 * gw + col, static_cast<float>(value));
      }
    }
    // wo_b has the same shape in both; copy it too (its creation order matches, but keep the test explicit).
    const TensorView wb = grouped.w.layers[l].v4.wo_b, sb = single.w.layers[l].v4.wo_b;
    for (int64_t i = 0; i < wb.numel(); ++i) set_element(sb, i, static_cast<float>(element_as_double(wb, i)));
  }
  const std::vector<int32_t> t = tokens(24, s.vocab);
  const DeepseekV4Reference a = grouped.run(t), b = single.run(t);
  for (int64_t p = 0; p < 24; ++p) EXPECT_LT(max_abs_diff(a.logits_at(p), b.logits_at(p)), 1e-10) << p;
}

TEST(DeepseekV4ReferenceModel, rejects_a_token_outside_the_vocabulary) {
  const TinyV4 m(small_shape({0}, 8), 18);
  const std::vector<int32_t> t{1, 64};
  EXPECT_THROW(m.run(t), std::invalid_argument);
}

TEST(DeepseekV4ReferenceModel, two_thousand_tokens_of_the_tiny_model_stay_finite) {
  // hidden 128, 4 heads x 512, layers: sliding window, compressed sparse, heavily compressed (128), sparse.
  const TinyV4 m(TinyV4Shape{}, 19);
  const int64_t n = 2000;
  const std::vector<int32_t> t = tokens(n, m.c.vocab_size);
  const auto start = std::chrono::steady_clock::now();
  const DeepseekV4Reference r = m.run(t);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("deepseek_v4_reference_forward: %lld tokens in %.2f s\n", static_cast<long long>(n), seconds);
  RecordProperty("seconds", std::to_string(seconds));
  ASSERT_EQ(r.logits.size(), static_cast<size_t>(n * m.c.vocab_size));
  for (double v : r.logits) ASSERT_TRUE(std::isfinite(v));
  double lo = 1e300, hi = -1e300;
  for (double v : r.logits_at(n - 1)) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_GT(hi - lo, 0.5) << "the logits are spread";
  for (int64_t l : {1, 3}) {
    ASSERT_EQ(r.index_selected[l].size(), static_cast<size_t>(n));
    EXPECT_EQ(r.index_selected[l][n - 1].size(), 8u) << "index_topk of the 500 visible entries";
  }
  EXPECT_TRUE(r.index_selected[0].empty());
  EXPECT_TRUE(r.index_selected[2].empty());
}

}  // namespace
}  // namespace genbridge::testing
