// Contract test for moe/topk_router; runs unchanged in every target build.
#include "genbridge/ops/moe/topk_router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
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

Routed route(const TensorView& logits, int64_t k, bool norm) {
  const int64_t T = logits.dim(0);
  Routed r{std::vector<int32_t>(static_cast<size_t>(T * k), -7), std::vector<float>(static_cast<size_t>(T * k), -7.f)};
  const Status st = ops::topk_router(logits, norm, TensorView(r.ids.data(), DType::kI32, {T, k}),
                                     TensorView(r.weights.data(), DType::kF32, {T, k}));
  EXPECT_TRUE(st.ok()) << st.to_string();
  return r;
}

// Ids equal the fp64 ranking (ties to the lower id) wherever the fp64 gap at the k-th place is clearly
// above fp32 resolution; weights match the fp64 probabilities (renormalised when asked).
void check_against_reference(DType d, int64_t T, int64_t E, int64_t k, bool norm, uint64_t seed) {
  OwnedTensor logits(d, {T, E});
  fill_uniform(logits.view(), seed, -4.f, 4.f);
  const auto before = logits.bytes();
  const Routed r = route(logits.view(), k, norm);
  EXPECT_EQ(logits.bytes(), before) << "logits were mutated";
  std::vector<double> p;
  ref::softmax_rows(to_doubles(logits.view()), T, E, p);
  int64_t compared = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[t * E + a] > p[t * E + b]; });
    bool clear = true;
    for (int64_t j = 0; j + 1 < E && j <= k; ++j) {
      const double a = p[t * E + order[j]], b = p[t * E + order[j + 1]];
      if (a - b < 1e-5 * a && a != b) clear = false;
    }
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += p[t * E + r.ids[t * k + j]];
    std::set<int32_t> distinct;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t id = r.ids[t * k + j];
      ASSERT_TRUE(id >= 0 && id < E) << "id " << id;
      distinct.insert(id);
      if (clear) {
        EXPECT_EQ(id, order[j]) << "token " << t << " slot " << j;
      }
      const double want = norm ? p[t * E + id] / sum : p[t * E + id];
      EXPECT_NEAR(r.weights[t * k + j], want, 2e-6 * want + 1e-12) << "token " << t << " slot " << j;
    }
    EXPECT_EQ(static_cast<int64_t>(distinct.size()), k);
    compared += clear;
  }
  EXPECT_GT(compared, T / 2) << "too few tokens without near-ties to compare ids";
}

TEST(TopkRouter, matches_fp64_reference) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (bool norm : {false, true}) {
      check_against_reference(d, 37, 64, 8, norm, 1);
      check_against_reference(d, 5, 128, 8, norm, 2);
      check_against_reference(d, 9, 60, 4, norm, 3);
    }
  }
}

TEST(TopkRouter, k_equals_one_and_k_equals_e) {
  check_against_reference(DType::kF32, 11, 16, 1, false, 4);
  check_against_reference(DType::kF32, 11, 16, 16, true, 5);
  check_against_reference(DType::kF32, 3, 1, 1, true, 6);
}

TEST(TopkRouter, ties_go_to_the_lower_expert_id) {
  // All equal: ids 0..k-1 in order, each weight 1/E (or 1/k renormalised).
  std::vector<float> flat(2 * 10, 0.5f);
  Routed r = route(TensorView(flat.data(), DType::kF32, {2, 10}), 4, false);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  for (float w : r.weights) EXPECT_FLOAT_EQ(w, 0.1f);
  r = route(TensorView(flat.data(), DType::kF32, {2, 10}), 4, true);
  for (float w : r.weights) EXPECT_FLOAT_EQ(w, 0.25f);
  // Ties among the winners and at the cut: 7 and 2 tie for first, 5 and 9 tie for third.
  std::vector<float> l = {0, 0, 3, 0, 0, 1, 0, 3, 0, 1};
  r = route(TensorView(l.data(), DType::kF32, {1, 10}), 3, false);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 7, 5}));
  EXPECT_EQ(r.weights[0], r.weights[1]);
}

TEST(TopkRouter, renormalised_weights_sum_to_one) {
  OwnedTensor logits(DType::kF32, {16, 64});
  fill_uniform(logits.view(), 8, -3.f, 3.f);
  const Routed r = route(logits.view(), 8, true);
  for (int64_t t = 0; t < 16; ++t) {
    float s = 0;
    for (int64_t j = 0; j < 8; ++j) s += r.weights[t * 8 + j];
    EXPECT_NEAR(s, 1.0f, 2e-6f);
    for (int64_t j = 0; j + 1 < 8; ++j) EXPECT_GE(r.weights[t * 8 + j], r.weights[t * 8 + j + 1]);
  }
}

TEST(TopkRouter, nan_and_infinite_logits_still_give_distinct_valid_ids) {
  std::vector<float> l = {NAN, 1, NAN, 2, INFINITY, -INFINITY, 0, NAN, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  const Routed r = route(TensorView(l.data(), DType::kF32, {3, 4}), 3, true);
  for (int64_t t = 0; t < 3; ++t) {
    std::set<int32_t> s;
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_TRUE(r.ids[t * 3 + j] >= 0 && r.ids[t * 3 + j] < 4);
      s.insert(r.ids[t * 3 + j]);
    }
    EXPECT_EQ(s.size(), 3u) << "token " << t;
  }
}

TEST(TopkRouter, strided_inputs_and_outputs) {
  OwnedTensor wide(DType::kF32, {6, 40}), ref_logits(DType::kF32, {6, 32});
  fill_uniform(wide.view(), 9);
  const TensorView logits = TensorView::strided(static_cast<float*>(wide.data()) + 8, DType::kF32, {6, 32}, {40, 1});
  for (int64_t i = 0; i < 6 * 32; ++i) ref_logits.view().data_as<float>()[i] = logits.data_as<float>()[logical_offset(logits, i)];
  const Routed want = route(ref_logits.view(), 4, true);
  std::vector<int32_t> ids_t(4 * 6);
  std::vector<float> w_pad(6 * 8);
  ASSERT_TRUE(ops::topk_router(logits, true, TensorView::strided(ids_t.data(), DType::kI32, {6, 4}, {1, 6}),
                               TensorView::strided(w_pad.data(), DType::kF32, {6, 4}, {8, 2}))
                  .ok());
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_EQ(ids_t[j * 6 + t], want.ids[t * 4 + j]);
      EXPECT_EQ(w_pad[t * 8 + 2 * j], want.weights[t * 4 + j]);
    }
}

TEST(TopkRouter, batch_invariant_and_thread_independent) {
  OwnedTensor logits(DType::kF32, {257, 128});
  fill_uniform(logits.view(), 10, -5.f, 5.f);
  set_num_threads(1);
  const Routed all = route(logits.view(), 8, true);
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    const Routed again = route(logits.view(), 8, true);
    EXPECT_EQ(again.ids, all.ids);
    EXPECT_EQ(again.weights, all.weights);
  }
  set_num_threads(0);
  for (int64_t t : {int64_t{0}, int64_t{100}, int64_t{256}}) {
    const Routed one = route(logits.view().slice0(t, t + 1), 8, true);
    EXPECT_TRUE(std::equal(one.ids.begin(), one.ids.end(), all.ids.begin() + t * 8));
    EXPECT_TRUE(std::equal(one.weights.begin(), one.weights.end(), all.weights.begin() + t * 8));
  }
}

TEST(TopkRouter, empty_batch) {
  std::vector<float> l(8);
  std::vector<int32_t> ids(2, -1);
  std::vector<float> w(2, -1.f);
  EXPECT_TRUE(ops::topk_router(TensorView(l.data(), DType::kF32, {0, 8}), true, TensorView(ids.data(), DType::kI32, {0, 2}),
                               TensorView(w.data(), DType::kF32, {0, 2}))
                  .ok());
  EXPECT_EQ(ids, (std::vector<int32_t>{-1, -1}));
}

TEST(TopkRouter, invalid_arguments) {
  std::vector<float> l(4 * 8, 1.f), w(4 * 2, -1.f), w_before = w;
  std::vector<int32_t> ids(4 * 2, -1), ids_before = ids;
  std::vector<int64_t> i64(64);
  const TensorView lv(l.data(), DType::kF32, {4, 8}), iv(ids.data(), DType::kI32, {4, 2}), wv(w.data(), DType::kF32, {4, 2});
  auto expect_error = [&](const std::string& message, const TensorView& a, const TensorView& b, const TensorView& c) {
    const Status st = ops::topk_router(a, true, b, c);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(ids, ids_before) << "topk_ids written on error";
    EXPECT_EQ(w, w_before) << "topk_weights written on error";
  };
  expect_error("topk_router: logits has dtype int64 but must be fp32, fp16 or bf16",
               TensorView(i64.data(), DType::kI64, {4, 8}), iv, wv);
  expect_error("topk_router: logits has rank 1 but must have rank 2 ([T, E])", TensorView(l.data(), DType::kF32, {32}), iv,
               wv);
  expect_error("topk_router: topk_ids has dtype int64 but must be int32", lv, TensorView(i64.data(), DType::kI64, {4, 2}),
               wv);
  expect_error("topk_router: k = 9 (topk_ids' last dimension) but must be in [1, 8] (1 <= k <= the number of experts)",
               lv, TensorView(i64.data(), DType::kI32, {4, 9}), TensorView(i64.data() + 40, DType::kF32, {4, 9}));
  expect_error("topk_router: k = 0 (topk_ids' last dimension) but must be in [1, 8] (1 <= k <= the number of experts)",
               lv, TensorView(ids.data(), DType::kI32, {4, 0}), TensorView(w.data(), DType::kF32, {4, 0}));
  expect_error("topk_router: topk_ids has shape [3, 2] but must be [4, 2] ([T, k] with T = logits' rows)", lv,
               TensorView(ids.data(), DType::kI32, {3, 2}), wv);
  expect_error("topk_router: topk_weights has dtype bf16 but must be fp32", lv, iv,
               TensorView(w.data(), DType::kBF16, {4, 2}));
  expect_error("topk_router: topk_weights has shape [4, 3] but must be [4, 2] ([T, k] like topk_ids)", lv, iv,
               TensorView(w.data(), DType::kF32, {4, 3}));
  expect_error("topk_router: topk_weights overlaps logits in memory; outputs must not alias inputs", lv, iv,
               TensorView(l.data(), DType::kF32, {4, 2}));
}

}  // namespace
}  // namespace genbridge::testing
