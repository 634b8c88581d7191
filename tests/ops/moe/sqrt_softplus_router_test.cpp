// Contract test for moe/sqrt_softplus_router (DeepSeek-V4 routing); runs unchanged in every target build.
#include "genbridge/ops/moe/sqrt_softplus_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/moe/moe_ref.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

const TensorView kNone;

Routed route(const TensorView& logits, const TensorView& bias, const TensorView& hash, int64_t k, bool renormalize,
             float rsf) {
  const int64_t T = logits.dim(0);
  Routed r{std::vector<int32_t>(static_cast<size_t>(T * k), -7), std::vector<float>(static_cast<size_t>(T * k), -7.f)};
  const Status st =
      ops::sqrt_softplus_router(logits, bias, hash, renormalize, rsf, TensorView(r.ids.data(), DType::kI32, {T, k}),
                                TensorView(r.weights.data(), DType::kF32, {T, k}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return r;
}

// The fp32 score of one logit as the contract writes it.
float score(float x) { return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x))); }

// Ids equal the fp64 contract's wherever its ranking margin is clearly above fp32 resolution (always, with
// hash ids); weights match the fp64 values; ids are always distinct (top-k) and in [0, E).
void check_against_reference(DType d, int64_t T, int64_t E, int64_t k, bool with_bias, bool hashed, bool renormalize,
                             float rsf, uint64_t seed) {
  SCOPED_TRACE("T=" + std::to_string(T) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
               (with_bias ? " bias" : "") + (hashed ? " hash" : "") + (renormalize ? " renormalize" : ""));
  OwnedTensor logits(d, {T, E}), bias(DType::kF32, {E}), hash(DType::kI32, {T, k});
  fill_uniform(logits.view(), seed, -6.f, 6.f);
  fill_uniform(bias.view(), seed + 100, -0.3f, 0.3f);
  std::mt19937_64 rng(seed + 200);
  int32_t* h = hash.view().data_as<int32_t>();
  for (int64_t i = 0; i < T * k; ++i) h[i] = static_cast<int32_t>(rng() % static_cast<uint64_t>(E));  // repeats too
  const auto before = logits.bytes();
  const Routed r =
      route(logits.view(), with_bias ? bias.view() : kNone, hashed ? hash.view() : kNone, k, renormalize, rsf);
  EXPECT_EQ(logits.bytes(), before) << "logits were mutated";
  const std::vector<double> l = to_doubles(logits.view()), b = to_doubles(bias.view());
  int64_t compared = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> ids;
    std::vector<double> w;
    double margin = 0;
    ref::sqrt_softplus_route(l.data() + t * E, with_bias ? b.data() : nullptr, hashed ? h + t * k : nullptr, E, k,
                             renormalize, rsf, ids, w, &margin);
    std::set<int32_t> distinct;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = r.ids[t * k + j];
      ASSERT_TRUE(id >= 0 && id < E) << "id " << id;
      distinct.insert(id);
    }
    if (!hashed) {
      EXPECT_EQ(static_cast<int64_t>(distinct.size()), k);
    }
    if (margin > 1e-5) {
      ++compared;
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(r.ids[t * k + j], ids[j]) << "token " << t << " slot " << j;
        EXPECT_NEAR(r.weights[t * k + j], w[j], 4e-6 * std::abs(w[j]) + 1e-30) << "token " << t << " slot " << j;
      }
    }
  }
  EXPECT_GT(compared, T / 2) << "too few tokens without near-ties to compare ids";
}

TEST(SqrtSoftplusRouter, matches_fp64_reference) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool renormalize : {false, true}) {
      for (bool with_bias : {false, true}) {
        check_against_reference(d, 33, 256, 6, with_bias, false, renormalize, 1.5f, 1);  // DeepSeek-V4-Flash
        check_against_reference(d, 17, 64, 8, with_bias, false, renormalize, 2.5f, 2);
        check_against_reference(d, 9, 19, 4, with_bias, false, renormalize, 1.0f, 3);
      }
    }
  }
}

TEST(SqrtSoftplusRouter, hash_ids_select_in_their_order_and_bias_is_ignored) {
  for (DType d : {DType::kF32, DType::kBF16}) {
    for (bool renormalize : {false, true}) {
      for (bool with_bias : {false, true}) {
        check_against_reference(d, 21, 256, 6, with_bias, true, renormalize, 1.5f, 4);
        check_against_reference(d, 5, 7, 7, with_bias, true, renormalize, 1.0f, 5);
      }
    }
  }
  // Exactly: ids in the given order (a repeat included), weights from the scores of those ids.
  std::vector<float> l = {0.5f, -1.0f, 2.0f, 25.0f};
  std::vector<int32_t> h = {2, 0, 2};
  std::vector<float> bias = {9.0f, 9.0f, -9.0f, -9.0f};
  const TensorView lv(l.data(), DType::kF32, {1, 4}), hv(h.data(), DType::kI32, {1, 3});
  Routed r = route(lv, TensorView(bias.data(), DType::kF32, {4}), hv, 3, false, 2.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0, 2}));
  EXPECT_EQ(r.weights, (std::vector<float>{score(2.0f) * 2.0f, score(0.5f) * 2.0f, score(2.0f) * 2.0f}));
  r = route(lv, kNone, hv, 3, true, 2.0f);
  const float sum = (score(2.0f) + score(0.5f)) + score(2.0f) + 1e-20f;
  EXPECT_EQ(r.weights,
            (std::vector<float>{score(2.0f) / sum * 2.0f, score(0.5f) / sum * 2.0f, score(2.0f) / sum * 2.0f}));
}

// softplus follows torch's threshold: x itself above 20, log1p(exp(x)) at and below it.
TEST(SqrtSoftplusRouter, scores_are_the_contracts_fp32_formula) {
  std::vector<float> l = {25.0f, 20.0f, 0.0f, -200.0f, 20.5f, -3.25f};
  const Routed r = route(TensorView(l.data(), DType::kF32, {1, 6}), kNone, kNone, 6, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 4, 1, 2, 5, 3}));
  EXPECT_EQ(r.weights[0], 5.0f);
  EXPECT_EQ(r.weights[1], std::sqrt(20.5f));
  EXPECT_EQ(r.weights[2], std::sqrt(std::log1p(std::exp(20.0f))));
  EXPECT_EQ(r.weights[3], std::sqrt(std::log1p(1.0f)));
  EXPECT_EQ(r.weights[4], std::sqrt(std::log1p(std::exp(-3.25f))));
  EXPECT_EQ(r.weights[5], 0.0f);  // exp underflows: softplus 0
}

TEST(SqrtSoftplusRouter, bias_selects_but_never_weights) {
  std::vector<float> l(4, 0.0f), b = {0.0f, 0.0f, 0.1f, -0.05f};
  const TensorView lv(l.data(), DType::kF32, {1, 4}), bv(b.data(), DType::kF32, {4});
  const float s0 = score(0.0f);
  Routed r = route(lv, bv, kNone, 2, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(r.weights, (std::vector<float>{s0, s0}));
  r = route(lv, bv, kNone, 2, true, 2.5f);
  EXPECT_EQ(r.weights, (std::vector<float>{s0 / (2 * s0 + 1e-20f) * 2.5f, s0 / (2 * s0 + 1e-20f) * 2.5f}));
}

TEST(SqrtSoftplusRouter, ties_go_to_the_lower_expert_id) {
  std::vector<float> flat(2 * 10, 0.5f);
  Routed r = route(TensorView(flat.data(), DType::kF32, {2, 10}), kNone, kNone, 4, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  r = route(TensorView(flat.data(), DType::kF32, {2, 10}), kNone, kNone, 4, true, 1.0f);
  for (float w : r.weights) EXPECT_FLOAT_EQ(w, 0.25f);
  // 7 and 2 tie for first, 5 and 9 for third (the cut).
  std::vector<float> l = {0, 0, 3, 0, 0, 1, 0, 3, 0, 1};
  r = route(TensorView(l.data(), DType::kF32, {1, 10}), kNone, kNone, 3, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 7, 5}));
  EXPECT_EQ(r.weights[0], r.weights[1]);
  // A bias can create the tie: s(1) + (s(2) - s(1)) == s(2) + 0 exactly in fp32 (the difference is exact).
  std::vector<float> l2 = {1.0f, 2.0f}, b2 = {score(2.0f) - score(1.0f), 0.0f};
  ASSERT_EQ(score(1.0f) + b2[0], score(2.0f));
  r = route(TensorView(l2.data(), DType::kF32, {1, 2}), TensorView(b2.data(), DType::kF32, {2}), kNone, 1, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0}));
  EXPECT_EQ(r.weights, (std::vector<float>{score(1.0f)}));
}

// NaN scores rank after every number (ties among them to the lower id); a NaN that is selected makes its
// weight, and with renormalisation every weight of the token, NaN.
TEST(SqrtSoftplusRouter, nan_logits_rank_last) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> l = {nan, 1,    nan, 2,  //
                          inf, -inf, 0,   nan};
  Routed r = route(TensorView(l.data(), DType::kF32, {2, 4}), kNone, kNone, 3, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3, 1, 0, 0, 2, 1}));
  EXPECT_EQ(r.weights[0], score(2.0f));
  EXPECT_TRUE(std::isnan(r.weights[2]));
  EXPECT_EQ(r.weights[3], inf);
  EXPECT_EQ(r.weights[5], 0.0f);
  r = route(TensorView(l.data(), DType::kF32, {2, 4}), kNone, kNone, 3, true, 1.0f);
  for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan(r.weights[j])) << j;
  // Only NaN: ids 0..k-1.
  std::vector<float> all_nan(5, nan);
  r = route(TensorView(all_nan.data(), DType::kF32, {1, 5}), kNone, kNone, 3, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2}));
  // A NaN bias entry ranks its expert last as well.
  std::vector<float> l1 = {5.0f, 1.0f, 2.0f}, b1 = {nan, 0.0f, 0.0f};
  r = route(TensorView(l1.data(), DType::kF32, {1, 3}), TensorView(b1.data(), DType::kF32, {3}), kNone, 2, false, 1.0f);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 1}));
}

TEST(SqrtSoftplusRouter, renormalize_on_and_off) {
  OwnedTensor logits(DType::kF32, {16, 64});
  fill_uniform(logits.view(), 8, -3.f, 3.f);
  const Routed raw = route(logits.view(), kNone, kNone, 8, false, 1.0f);
  const Routed norm = route(logits.view(), kNone, kNone, 8, true, 1.0f);
  const Routed scaled = route(logits.view(), kNone, kNone, 8, true, 2.5f);
  EXPECT_EQ(raw.ids, norm.ids);
  for (int64_t t = 0; t < 16; ++t) {
    float sum_raw = 0, sum = 0;
    for (int64_t j = 0; j < 8; ++j) {
      sum_raw += raw.weights[t * 8 + j];
      sum += norm.weights[t * 8 + j];
      EXPECT_EQ(scaled.weights[t * 8 + j], norm.weights[t * 8 + j] * 2.5f);
      if (j > 0) {
        EXPECT_GE(raw.weights[t * 8 + j - 1], raw.weights[t * 8 + j]);
      }
    }
    EXPECT_NEAR(sum, 1.0f, 2e-6f);
    for (int64_t j = 0; j < 8; ++j) EXPECT_EQ(norm.weights[t * 8 + j], raw.weights[t * 8 + j] / (sum_raw + 1e-20f));
  }
}

TEST(SqrtSoftplusRouter, k_equals_e_ranks_every_expert) {
  check_against_reference(DType::kF32, 11, 16, 16, true, false, true, 1.5f, 6);
  check_against_reference(DType::kF32, 11, 16, 16, false, false, false, 1.0f, 7);
  check_against_reference(DType::kF32, 3, 1, 1, false, false, true, 1.0f, 8);
}

TEST(SqrtSoftplusRouter, strided_inputs_and_outputs) {
  OwnedTensor wide(DType::kF32, {6, 40}), dense(DType::kF32, {6, 32}), bias_wide(DType::kF32, {64}),
      bias(DType::kF32, {32});
  fill_uniform(wide.view(), 9);
  fill_uniform(bias_wide.view(), 10, -0.5f, 0.5f);
  const TensorView logits = TensorView::strided(static_cast<float*>(wide.data()) + 8, DType::kF32, {6, 32}, {40, 1});
  const TensorView bias_s = TensorView::strided(bias_wide.data(), DType::kF32, {32}, {2});
  for (int64_t i = 0; i < 6 * 32; ++i)
    dense.view().data_as<float>()[i] = logits.data_as<float>()[logical_offset(logits, i)];
  for (int64_t i = 0; i < 32; ++i) bias.view().data_as<float>()[i] = bias_s.data_as<float>()[2 * i];
  for (bool hashed : {false, true}) {
    std::vector<int32_t> h(4 * 6), h_t(4 * 6);
    for (int64_t t = 0; t < 6; ++t)
      for (int64_t j = 0; j < 4; ++j) {
        h[t * 4 + j] = static_cast<int32_t>((t * 5 + j * 3) % 32);
        h_t[j * 6 + t] = h[t * 4 + j];
      }
    const Routed want =
        route(dense.view(), bias.view(), hashed ? TensorView(h.data(), DType::kI32, {6, 4}) : kNone, 4, true, 1.5f);
    std::vector<int32_t> ids_t(4 * 6);
    std::vector<float> w_pad(6 * 8);
    ASSERT_TRUE(ops::sqrt_softplus_router(logits, bias_s,
                                          hashed ? TensorView::strided(h_t.data(), DType::kI32, {6, 4}, {1, 6}) : kNone,
                                          true, 1.5f, TensorView::strided(ids_t.data(), DType::kI32, {6, 4}, {1, 6}),
                                          TensorView::strided(w_pad.data(), DType::kF32, {6, 4}, {8, 2}))
                    .ok());
    for (int64_t t = 0; t < 6; ++t)
      for (int64_t j = 0; j < 4; ++j) {
        EXPECT_EQ(ids_t[j * 6 + t], want.ids[t * 4 + j]);
        EXPECT_EQ(w_pad[t * 8 + 2 * j], want.weights[t * 4 + j]);
      }
  }
}

// A large batch: each token's bits equal the token routed alone, with 1, 2 or 3 threads.
TEST(SqrtSoftplusRouter, large_batch_is_token_invariant_and_thread_independent) {
  const int64_t T = 4099, E = 256, k = 6;
  OwnedTensor logits(DType::kBF16, {T, E}), bias(DType::kF32, {E});
  fill_uniform(logits.view(), 10, -5.f, 5.f);
  fill_uniform(bias.view(), 11, -0.1f, 0.1f);
  set_num_threads(1);
  const Routed all = route(logits.view(), bias.view(), kNone, k, true, 1.5f);
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    const Routed again = route(logits.view(), bias.view(), kNone, k, true, 1.5f);
    EXPECT_EQ(again.ids, all.ids);
    EXPECT_EQ(std::memcmp(again.weights.data(), all.weights.data(), all.weights.size() * sizeof(float)), 0);
  }
  set_num_threads(0);
  for (int64_t t : {int64_t{0}, int64_t{2048}, T - 1}) {
    const Routed one = route(logits.view().slice0(t, t + 1), bias.view(), kNone, k, true, 1.5f);
    EXPECT_TRUE(std::equal(one.ids.begin(), one.ids.end(), all.ids.begin() + t * k)) << t;
    EXPECT_EQ(std::memcmp(one.weights.data(), all.weights.data() + t * k, k * sizeof(float)), 0) << t;
  }
}

TEST(SqrtSoftplusRouter, empty_batch) {
  std::vector<float> l(8);
  std::vector<int32_t> ids(2, -1), h(2, 0);
  std::vector<float> w(2, -1.f);
  for (bool hashed : {false, true}) {
    EXPECT_TRUE(ops::sqrt_softplus_router(TensorView(l.data(), DType::kF32, {0, 8}), kNone,
                                          hashed ? TensorView(h.data(), DType::kI32, {0, 2}) : kNone, true, 1.0f,
                                          TensorView(ids.data(), DType::kI32, {0, 2}),
                                          TensorView(w.data(), DType::kF32, {0, 2}))
                    .ok());
  }
  EXPECT_EQ(ids, (std::vector<int32_t>{-1, -1}));
  EXPECT_EQ(w, (std::vector<float>{-1.f, -1.f}));
}

TEST(SqrtSoftplusRouter, invalid_arguments) {
  std::vector<float> l(4 * 8, 1.f), w(4 * 2, -1.f), w_before = w, b(8, 0.f);
  std::vector<int32_t> ids(4 * 2, -1), ids_before = ids, h = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<int64_t> i64(64);
  const TensorView lv(l.data(), DType::kF32, {4, 8}), iv(ids.data(), DType::kI32, {4, 2}),
      wv(w.data(), DType::kF32, {4, 2}), bv(b.data(), DType::kF32, {8}), hv(h.data(), DType::kI32, {4, 2});
  auto expect_error = [&](const std::string& message, const TensorView& logits, const TensorView& bias,
                          const TensorView& hash, float rsf, const TensorView& oi, const TensorView& ow) {
    const Status st = ops::sqrt_softplus_router(logits, bias, hash, true, rsf, oi, ow);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(ids, ids_before) << "topk_ids written on error: " << message;
    EXPECT_EQ(w, w_before) << "topk_weights written on error: " << message;
  };
  expect_error("sqrt_softplus_router: logits has dtype int64 but must be fp32, fp16 or bf16",
               TensorView(i64.data(), DType::kI64, {4, 8}), kNone, kNone, 1.f, iv, wv);
  expect_error("sqrt_softplus_router: logits has rank 1 but must have rank 2 ([T, E])",
               TensorView(l.data(), DType::kF32, {32}), kNone, kNone, 1.f, iv, wv);
  expect_error("sqrt_softplus_router: topk_ids has dtype int64 but must be int32", lv, kNone, kNone, 1.f,
               TensorView(i64.data(), DType::kI64, {4, 2}), wv);
  expect_error(
      "sqrt_softplus_router: k = 9 (topk_ids' last dimension) but must be in [1, 8] (1 <= k <= the number of "
      "experts)",
      lv, kNone, kNone, 1.f, TensorView(i64.data(), DType::kI32, {4, 9}),
      TensorView(i64.data() + 40, DType::kF32, {4, 9}));
  expect_error(
      "sqrt_softplus_router: k = 0 (topk_ids' last dimension) but must be in [1, 8] (1 <= k <= the number of "
      "experts)",
      lv, kNone, kNone, 1.f, TensorView(ids.data(), DType::kI32, {4, 0}), TensorView(w.data(), DType::kF32, {4, 0}));
  expect_error("sqrt_softplus_router: topk_ids has shape [3, 2] but must be [4, 2] ([T, k] with T = logits' rows)", lv,
               kNone, kNone, 1.f, TensorView(ids.data(), DType::kI32, {3, 2}), wv);
  expect_error("sqrt_softplus_router: topk_weights has dtype bf16 but must be fp32", lv, kNone, kNone, 1.f, iv,
               TensorView(w.data(), DType::kBF16, {4, 2}));
  expect_error("sqrt_softplus_router: topk_weights has shape [4, 3] but must be [4, 2] ([T, k] like topk_ids)", lv,
               kNone, kNone, 1.f, iv, TensorView(w.data(), DType::kF32, {4, 3}));
  expect_error("sqrt_softplus_router: topk_weights overlaps logits in memory; outputs must not alias inputs", lv, kNone,
               kNone, 1.f, iv, TensorView(l.data(), DType::kF32, {4, 2}));
  expect_error("sqrt_softplus_router: topk_weights overlaps topk_ids in memory; outputs must not alias inputs", lv,
               kNone, kNone, 1.f, iv, TensorView(ids.data(), DType::kF32, {4, 2}));
  expect_error("sqrt_softplus_router: bias has dtype bf16 but must be fp32", lv,
               TensorView(b.data(), DType::kBF16, {8}), kNone, 1.f, iv, wv);
  expect_error("sqrt_softplus_router: bias has shape [7] but must be [8] ([E] with E = logits' columns)", lv,
               TensorView(b.data(), DType::kF32, {7}), kNone, 1.f, iv, wv);
  expect_error("sqrt_softplus_router: topk_weights overlaps bias in memory; outputs must not alias inputs", lv,
               TensorView(w.data(), DType::kF32, {8}), kNone, 1.f, iv, wv);
  expect_error("sqrt_softplus_router: hash_ids has dtype int64 but must be int32", lv, kNone,
               TensorView(i64.data(), DType::kI64, {4, 2}), 1.f, iv, wv);
  expect_error("sqrt_softplus_router: hash_ids has shape [4, 3] but must be [4, 2] ([T, k] like topk_ids)", lv, kNone,
               TensorView(h.data(), DType::kI32, {4, 3}), 1.f, iv, wv);
  expect_error("sqrt_softplus_router: topk_ids overlaps hash_ids in memory; outputs must not alias inputs", lv, kNone,
               iv, 1.f, iv, wv);
  for (const auto& [rsf, text] : {std::pair<float, const char*>{0.0f, "0"},
                                  {-1.5f, "-1.5"},
                                  {std::numeric_limits<float>::infinity(), "inf"},
                                  {std::numeric_limits<float>::quiet_NaN(), "nan"}}) {
    expect_error("sqrt_softplus_router: routed_scaling_factor is " + std::string(text) + " but must be finite and > 0",
                 lv, bv, hv, rsf, iv, wv);
  }
  // Hash ids outside [0, E): named by token and slot, found before anything is written.
  h[5] = 8;
  expect_error("sqrt_softplus_router: hash_ids of token 2, slot 1 is 8 but expert ids must lie in [0, 8)", lv, bv, hv,
               1.f, iv, wv);
  h[5] = 5;
  h[6] = -1;
  expect_error("sqrt_softplus_router: hash_ids of token 3, slot 0 is -1 but expert ids must lie in [0, 8)", lv, kNone,
               hv, 1.f, iv, wv);
}

}  // namespace
}  // namespace genbridge::testing
