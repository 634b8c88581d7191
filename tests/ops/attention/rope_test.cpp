// Contract test for attention/rope; runs unchanged in every target build.
#include "genbridge/ops/attention/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/attention/attention_ref.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

double tolerance(DType d) { return d == DType::kF32 ? 1e-5 : (d == DType::kF16 ? 1e-3 : 8e-3); }

// Runs rope on seeded q/k (dtypes qd/kd, optionally strided) and checks both against the fp64 oracle.
void check(DType qd, DType kd, DType pd, int64_t d, float theta, std::vector<int64_t> pos, bool strided = false) {
  const int64_t t = static_cast<int64_t>(pos.size()), hq = 8, hk = 2;
  const int64_t pad = strided ? 3 : 1;
  OwnedTensor qs(qd, {t * hq * d * pad}), ks(kd, {t * hk * d * pad});
  const TensorView q = strided ? TensorView::strided(qs.data(), qd, {t, hq, d}, {hq * d * 3, d * 3, 1})
                               : TensorView(qs.data(), qd, {t, hq, d});
  const TensorView k = strided ? TensorView::strided(ks.data(), kd, {t, hk, d}, {hk * d * 3, d * 3, 1})
                               : TensorView(ks.data(), kd, {t, hk, d});
  fill_uniform(q, 3, -2.f, 2.f);
  fill_uniform(k, 4, -2.f, 2.f);
  std::vector<double> qref = to_doubles(q), kref = to_doubles(k);
  ref::rope(pos, hq, d, theta, qref);
  ref::rope(pos, hk, d, theta, kref);
  std::vector<int32_t> p32(pos.begin(), pos.end());
  const TensorView pv = pd == DType::kI32 ? TensorView(p32.data(), DType::kI32, {t}) : TensorView(pos.data(), DType::kI64, {t});
  const std::vector<int32_t> p32_before = p32;
  const std::vector<int64_t> pos_before = pos;
  const Status st = ops::rope(pv, q, k, theta);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(p32, p32_before);
  EXPECT_EQ(pos, pos_before);
  for (auto [view, want, dt] : {std::tuple{q, &qref, qd}, std::tuple{k, &kref, kd}}) {
    const std::vector<double> got = to_doubles(view);
    const double tol = tolerance(dt);
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::abs(got[i] - (*want)[i]) > tol + tol * std::abs((*want)[i]) && ++bad < 5) {
        ADD_FAILURE() << dtype_name(dt) << " element " << i << ": got " << got[i] << " want " << (*want)[i];
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(Rope, matches_fp64_reference_every_dtype) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) check(d, d, DType::kI64, 128, 10000.f, {0, 1, 2, 17, 300, 4095});
}

TEST(Rope, query_and_key_dtypes_may_differ_and_positions_int32) {
  check(DType::kBF16, DType::kF32, DType::kI32, 64, 1e6f, {5, 6, 7});
}

TEST(Rope, large_positions_use_the_fp32_angle) { check(DType::kF32, DType::kF32, DType::kI32, 128, 1e6f, {32767, 131071, 1000003}); }

TEST(Rope, head_dims) {
  for (int64_t d : {2, 64, 96, 256}) check(DType::kF32, DType::kBF16, DType::kI64, d, 10000.f, {0, 9, 77});
}

TEST(Rope, strided_input) { check(DType::kBF16, DType::kF16, DType::kI64, 128, 10000.f, {3, 1, 4, 1, 5}, true); }

TEST(Rope, position_zero_is_identity) {
  OwnedTensor q(DType::kBF16, {1, 4, 64}), k(DType::kBF16, {1, 1, 64});
  fill_uniform(q.view(), 1);
  fill_uniform(k.view(), 2);
  const auto qb = q.bytes(), kb = k.bytes();
  std::vector<int64_t> pos = {0};
  ASSERT_TRUE(ops::rope(TensorView(pos.data(), DType::kI64, {1}), q.view(), k.view(), 10000.f).ok());
  EXPECT_EQ(q.bytes(), qb);
  EXPECT_EQ(k.bytes(), kb);
}

std::vector<std::byte> rope_bits(int threads) {
  set_num_threads(threads);
  OwnedTensor q(DType::kBF16, {333, 16, 128}), k(DType::kBF16, {333, 4, 128});
  fill_uniform(q.view(), 1);
  fill_uniform(k.view(), 2);
  std::vector<int32_t> pos(333);
  for (int i = 0; i < 333; ++i) pos[i] = i * 7;
  EXPECT_TRUE(ops::rope(TensorView(pos.data(), DType::kI32, {333}), q.view(), k.view(), 10000.f).ok());
  set_num_threads(0);
  std::vector<std::byte> out = q.bytes();
  out.insert(out.end(), k.bytes().begin(), k.bytes().end());
  return out;
}

TEST(Rope, bit_identical_across_thread_counts) {
  const auto one = rope_bits(1);
  EXPECT_EQ(one, rope_bits(2));
  EXPECT_EQ(one, rope_bits(3));
}

TEST(Rope, empty_tokens) {
  OwnedTensor q(DType::kBF16, {0, 4, 64}), k(DType::kBF16, {0, 1, 64});
  std::vector<int64_t> pos(1);
  EXPECT_TRUE(ops::rope(TensorView(pos.data(), DType::kI64, {0}), q.view(), k.view(), 10000.f).ok());
}

TEST(Rope, invalid_arguments) {
  OwnedTensor q(DType::kBF16, {2, 4, 64}), k(DType::kBF16, {2, 1, 64});
  fill_uniform(q.view(), 1);
  std::vector<int64_t> pos = {0, 5};
  const TensorView pv(pos.data(), DType::kI64, {2});
  auto expect = [&](const std::string& msg, const TensorView& p, const TensorView& qv, const TensorView& kv,
                    float theta = 10000.f) {
    const auto qb = q.bytes(), kb = k.bytes();
    const Status st = ops::rope(p, qv, kv, theta);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), msg);
    EXPECT_EQ(q.bytes(), qb) << "query written on error";
    EXPECT_EQ(k.bytes(), kb) << "key written on error";
  };
  expect("rope: positions has dtype fp32 but must be int32 or int64", TensorView(pos.data(), DType::kF32, {2}),
         q.view(), k.view());
  expect("rope: positions has shape [2, 1] but must be [num_tokens]", TensorView(pos.data(), DType::kI64, {2, 1}),
         q.view(), k.view());
  expect("rope: query has dtype int8 but must be fp32, fp16 or bf16", pv, TensorView(q.data(), DType::kI8, {2, 4, 64}),
         k.view());
  expect("rope: query has shape [8, 64] but must have rank 3 [num_tokens, num_heads, head_dim]", pv,
         TensorView(q.data(), DType::kBF16, {8, 64}), k.view());
  expect("rope: key has shape [2, 64] but must have rank 3 [num_tokens, num_kv_heads, head_dim]", pv, q.view(),
         TensorView(k.data(), DType::kBF16, {2, 64}));
  expect("rope: key has a null data pointer but 128 elements", pv, q.view(),
         TensorView(nullptr, DType::kBF16, {2, 1, 64}));
  expect("rope: query has shape [1, 4, 64] and key has shape [2, 1, 64] but both must have positions' 2 tokens", pv,
         TensorView(q.data(), DType::kBF16, {1, 4, 64}), k.view());
  expect("rope: key has head_dim 32 but query has head_dim 64", pv, q.view(),
         TensorView(k.data(), DType::kBF16, {2, 1, 32}));
  expect("rope: head_dim 63 is odd but must be even (NeoX rotates the pairs (i, i + head_dim/2))", pv,
         TensorView(q.data(), DType::kBF16, {2, 4, 63}), TensorView(k.data(), DType::kBF16, {2, 1, 63}));
  expect("rope: rope_theta is 1 but must be finite and > 1", pv, q.view(), k.view(), 1.f);
  expect("rope: rope_theta is inf but must be finite and > 1", pv, q.view(), k.view(), INFINITY);
  pos = {0, -3};
  expect("rope: positions[1] = -3 but positions must be >= 0", pv, q.view(), k.view());
}

}  // namespace
}  // namespace genbridge::testing
