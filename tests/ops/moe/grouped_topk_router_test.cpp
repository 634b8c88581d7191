// Contract test for moe/grouped_topk_router (DeepSeek-V3 routing); runs unchanged in every target build.
#include "genbridge/ops/moe/grouped_topk_router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/moe/moe_ref.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

using ops::GroupedTopkParams;

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

Routed route(const TensorView& logits, const TensorView& bias, const GroupedTopkParams& p, int64_t k) {
  const int64_t T = logits.dim(0);
  Routed r{std::vector<int32_t>(static_cast<size_t>(T * k), -7), std::vector<float>(static_cast<size_t>(T * k), -7.f)};
  const Status st = ops::grouped_topk_router(logits, bias, p, TensorView(r.ids.data(), DType::kI32, {T, k}),
                                             TensorView(r.weights.data(), DType::kF32, {T, k}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return r;
}

const TensorView kNoBias;

// Ids equal the fp64 contract's wherever its decision margin is clearly above fp32 resolution; weights
// match the fp64 values; ids are always distinct and inside the kept groups' range.
void check_against_reference(DType d, int64_t T, int64_t E, GroupedTopkParams p, int64_t k, bool with_bias,
                             uint64_t seed) {
  OwnedTensor logits(d, {T, E}), bias(DType::kF32, {E});
  fill_uniform(logits.view(), seed, -4.f, 4.f);
  fill_uniform(bias.view(), seed + 100, -0.2f, 0.2f);
  const auto before = logits.bytes();
  const Routed r = route(logits.view(), with_bias ? bias.view() : kNoBias, p, k);
  EXPECT_EQ(logits.bytes(), before) << "logits were mutated";
  const std::vector<double> l = to_doubles(logits.view()), b = to_doubles(bias.view());
  int64_t compared = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int64_t> ids;
    std::vector<double> w;
    double margin = 0;
    ref::grouped_topk_route(l.data() + t * E, with_bias ? b.data() : nullptr, E, p.n_group, p.topk_group, k,
                            p.norm_topk_prob, p.routed_scaling_factor, ids, w, &margin);
    std::set<int32_t> distinct;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = r.ids[t * k + j];
      ASSERT_TRUE(id >= 0 && id < E) << "id " << id;
      distinct.insert(id);
    }
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), k);
    if (margin > 1e-5) {
      ++compared;
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(r.ids[t * k + j], ids[j]) << "token " << t << " slot " << j;
        EXPECT_NEAR(r.weights[t * k + j], w[j], 4e-6 * std::abs(w[j]) + 1e-12) << "token " << t << " slot " << j;
      }
    }
  }
  EXPECT_GT(compared, T / 2) << "too few tokens without near-ties to compare ids";
}

TEST(GroupedTopkRouter, matches_fp64_reference) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool norm : {false, true}) {
      for (bool bias : {false, true}) {
        check_against_reference(d, 33, 64, {8, 4, norm, 2.5f}, 8, bias, 1);
        check_against_reference(d, 17, 16, {4, 2, norm, 1.0f}, 4, bias, 2);
        check_against_reference(d, 9, 60, {1, 1, norm, 1.5f}, 6, bias, 3);
        check_against_reference(d, 9, 12, {6, 3, norm, 1.0f}, 6, bias, 4);  // k = every kept expert
      }
    }
  }
}

TEST(GroupedTopkRouter, groups_limit_the_choice) {
  // Groups {0,1} {2,3} {4,5} {6,7}; expert 0 is the single best, but its group's partner is weak, so groups
  // 1 and 2 (two good experts each) win and plain top-2 ({0, 2}) is not what routing picks.
  std::vector<float> l = {4, -4, 2, 2, 1, 1, -1, -1};
  const Routed r = route(TensorView(l.data(), DType::kF32, {1, 8}), kNoBias, {4, 2, false, 1.0f}, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));  // tie: lower id first
  const float s2 = 1.0f / (1.0f + std::exp(-2.0f));
  EXPECT_EQ(r.weights, (std::vector<float>{s2, s2}));
  // One group of all eight: expert 0 comes first.
  const Routed flat = route(TensorView(l.data(), DType::kF32, {1, 8}), kNoBias, {1, 1, false, 1.0f}, 2);
  EXPECT_EQ(flat.ids, (std::vector<int32_t>{0, 2}));
}

TEST(GroupedTopkRouter, bias_selects_but_never_weights) {
  std::vector<float> l(4, 0.0f), b = {0.0f, 0.0f, 0.1f, -0.05f};
  const TensorView lv(l.data(), DType::kF32, {1, 4}), bv(b.data(), DType::kF32, {4});
  Routed r = route(lv, bv, {1, 1, false, 1.0f}, 2);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(r.weights, (std::vector<float>{0.5f, 0.5f}));  // sigmoid(0), no bias
  r = route(lv, bv, {1, 1, true, 2.5f}, 2);
  EXPECT_EQ(r.weights, (std::vector<float>{1.25f, 1.25f}));  // renormalised, then scaled
  // bf16 bias is read as its exact value.
  std::vector<bf16_t> bb = {float_to_bf16(0.0f), float_to_bf16(0.25f), float_to_bf16(0.0f), float_to_bf16(0.0f)};
  r = route(lv, TensorView(bb.data(), DType::kBF16, {4}), {1, 1, false, 1.0f}, 1);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1}));
}

TEST(GroupedTopkRouter, ties_go_to_the_lower_group_and_expert_id) {
  std::vector<float> flat(2 * 12, 0.5f);
  const Routed r = route(TensorView(flat.data(), DType::kF32, {2, 12}), kNoBias, {4, 2, false, 1.0f}, 4);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  // Groups of 3: group 2 (experts 7, 8 at logit 1) beats group 0 (expert 1), groups 1 and 3 tie below:
  // kept groups {2, 0}; the three-way tie of experts 1, 7 and 8 goes to the lower ids first.
  std::vector<float> l = {0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0};
  const Routed t = route(TensorView(l.data(), DType::kF32, {1, 12}), kNoBias, {4, 2, false, 1.0f}, 3);
  EXPECT_EQ(t.ids, (std::vector<int32_t>{1, 7, 8}));
}

TEST(GroupedTopkRouter, nan_logits_still_give_distinct_valid_ids) {
  std::vector<float> l = {NAN, 1, NAN, 2, INFINITY, -INFINITY, 0, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
  const Routed r = route(TensorView(l.data(), DType::kF32, {2, 8}), kNoBias, {4, 2, true, 1.0f}, 3);
  for (int64_t t = 0; t < 2; ++t) {
    std::set<int32_t> s;
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_TRUE(r.ids[t * 3 + j] >= 0 && r.ids[t * 3 + j] < 8);
      s.insert(r.ids[t * 3 + j]);
    }
    EXPECT_EQ(s.size(), 3u) << "token " << t;
  }
}

TEST(GroupedTopkRouter, strided_batch_invariant_and_thread_independent) {
  OwnedTensor logits(DType::kF32, {129, 64}), bias(DType::kF32, {64});
  fill_uniform(logits.view(), 10, -5.f, 5.f);
  fill_uniform(bias.view(), 11, -0.1f, 0.1f);
  const GroupedTopkParams p{8, 4, true, 2.5f};
  set_num_threads(1);
  const Routed all = route(logits.view(), bias.view(), p, 8);
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    const Routed again = route(logits.view(), bias.view(), p, 8);
    EXPECT_EQ(again.ids, all.ids);
    EXPECT_EQ(again.weights, all.weights);
  }
  set_num_threads(0);
  for (int64_t t : {int64_t{0}, int64_t{64}, int64_t{128}}) {
    const Routed one = route(logits.view().slice0(t, t + 1), bias.view(), p, 8);
    EXPECT_TRUE(std::equal(one.ids.begin(), one.ids.end(), all.ids.begin() + t * 8));
    EXPECT_TRUE(std::equal(one.weights.begin(), one.weights.end(), all.weights.begin() + t * 8));
  }
  // Transposed outputs and a strided bias.
  std::vector<float> bias_pad(128);
  for (int64_t e = 0; e < 64; ++e) bias_pad[2 * e] = bias.view().data_as<float>()[e];
  std::vector<int32_t> ids_t(8 * 129);
  std::vector<float> w_pad(129 * 16);
  ASSERT_TRUE(ops::grouped_topk_router(logits.view(), TensorView::strided(bias_pad.data(), DType::kF32, {64}, {2}), p,
                                       TensorView::strided(ids_t.data(), DType::kI32, {129, 8}, {1, 129}),
                                       TensorView::strided(w_pad.data(), DType::kF32, {129, 8}, {16, 2}))
                  .ok());
  for (int64_t t = 0; t < 129; ++t) {
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_EQ(ids_t[j * 129 + t], all.ids[t * 8 + j]);
      EXPECT_EQ(w_pad[t * 16 + 2 * j], all.weights[t * 8 + j]);
    }
  }
}

TEST(GroupedTopkRouter, empty_batch) {
  std::vector<float> l(8);
  std::vector<int32_t> ids(2, -1);
  std::vector<float> w(2, -1.f);
  EXPECT_TRUE(ops::grouped_topk_router(TensorView(l.data(), DType::kF32, {0, 8}), kNoBias, {2, 1, true, 1.0f},
                                       TensorView(ids.data(), DType::kI32, {0, 2}),
                                       TensorView(w.data(), DType::kF32, {0, 2}))
                  .ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{-1, -1}));
}

TEST(GroupedTopkRouter, invalid_arguments) {
  std::vector<float> l(4 * 8, 1.f), w(4 * 2, -1.f), w_before = w, b(8);
  std::vector<int32_t> ids(4 * 2, -1), ids_before = ids;
  std::vector<int64_t> i64(64);
  const TensorView lv(l.data(), DType::kF32, {4, 8}), iv(ids.data(), DType::kI32, {4, 2}),
      wv(w.data(), DType::kF32, {4, 2}), bv(b.data(), DType::kF32, {8});
  auto expect_error = [&](const std::string& message, const TensorView& a, const TensorView& bias,
                          const GroupedTopkParams& p, const TensorView& x, const TensorView& y) {
    const Status st = ops::grouped_topk_router(a, bias, p, x, y);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(ids, ids_before) << "topk_ids written on error";
    EXPECT_EQ(w, w_before) << "topk_weights written on error";
  };
  const GroupedTopkParams ok{4, 2, true, 1.0f};
  expect_error("grouped_topk_router: logits has dtype int64 but must be fp32, fp16 or bf16",
               TensorView(i64.data(), DType::kI64, {4, 8}), bv, ok, iv, wv);
  expect_error("grouped_topk_router: bias has shape [7] but must be [8] ([E] with E = logits' columns)", lv,
               TensorView(b.data(), DType::kF32, {7}), ok, iv, wv);
  expect_error("grouped_topk_router: n_group = 3 but must be a positive divisor of the number of experts (8)", lv, bv,
               {3, 1, true, 1.0f}, iv, wv);
  expect_error("grouped_topk_router: topk_group = 5 but must be in [1, n_group = 4]", lv, bv, {4, 5, true, 1.0f}, iv,
               wv);
  expect_error("grouped_topk_router: routed_scaling_factor is not finite", lv, bv, {4, 2, true, INFINITY}, iv, wv);
  expect_error(
      "grouped_topk_router: k = 5 (topk_ids' last dimension) but must be in [1, 4] (1 <= k <= topk_group * E / "
      "n_group, the experts of the kept groups)",
      lv, bv, ok, TensorView(i64.data(), DType::kI32, {4, 5}), TensorView(i64.data() + 40, DType::kF32, {4, 5}));
  expect_error("grouped_topk_router: topk_weights has dtype bf16 but must be fp32", lv, bv, ok, iv,
               TensorView(w.data(), DType::kBF16, {4, 2}));
  expect_error("grouped_topk_router: topk_weights overlaps topk_ids in memory; outputs must not alias inputs", lv, bv,
               ok, iv, TensorView(ids.data(), DType::kF32, {4, 2}));
}

}  // namespace
}  // namespace genbridge::testing
