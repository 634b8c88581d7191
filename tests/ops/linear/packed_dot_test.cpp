// The packed bf16 weight path of the dot kernel (ops/common/linear/dot_kernel.h, ops/linear/packed_weights.h)
// gives the bits of the unpacked kernel (the contract's 16-lane order) for every row count, every shape edge
// (K below, at and past a 16-element block, an odd number of blocks; N not a multiple of the 16-row panel),
// every CPU target (from 64 rows on AVX2 and 256 on AVX-512, panels widened for the GEMM micro-kernel), and values that test the order itself:
// products that underflow to -0 (one extra padded step would make the sum +0), infinities and NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear/packed_weights.h"
#include "ops/common/linear/dot_kernel.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// out = a . w^T through the unpacked kernel and through the packed one; both [m, n] with a row stride of n + 3.
void expect_same_bits(OwnedTensor& a, OwnedTensor& w, int64_t m, const std::string& what) {
  const int64_t n = w.view().dim(0), K = w.view().dim(1), ldo = n + 3;
  auto packed = ops::PackedWeights::pack(w.view());
  ASSERT_TRUE(packed.ok()) << packed.status().to_string();
  std::vector<float> want(static_cast<size_t>(m * ldo), -1.f), got(static_cast<size_t>(m * ldo), -1.f);
  const float* ap = static_cast<const float*>(a.view().data());
  ops::detail::dot_rows_fn(DType::kBF16)(ap, K, m, w.view().data(), K, n, K, want.data(), ldo);
  ops::detail::dot_packed_fn()(ap, K, m, packed->words(), n, K, got.data(), ldo);
  const int64_t d = first_difference(want, got);
  ASSERT_EQ(d, -1) << what << " m " << m << " n " << n << " K " << K << ": element " << d << " (row " << d / ldo
                   << ", column " << d % ldo << ") is " << got[d] << ", unpacked " << want[d];
}

TEST(PackedDot, every_shape_row_count_and_target_gives_the_unpacked_bits) {
  for_each_cpu_target([&](const std::string&) {
    for (int64_t K : {1, 7, 16, 17, 31, 32, 33, 48, 100, 1024}) {
      for (int64_t n : {1, 15, 16, 17, 40}) {
        OwnedTensor a(DType::kF32, {300, K}), w(DType::kBF16, {n, K});
        fill_uniform(a.view(), 7 + K, -2.f, 2.f);
        fill_uniform(w.view(), 9 + n, -0.5f, 0.5f);
        // Input rows of fp32 values, then of bf16 values (the bf16 dot instruction's path where the CPU has one).
        for (bool bf16_rows : {false, true}) {
          if (bf16_rows) {
            float* ap = static_cast<float*>(a.view().data());
            for (int64_t i = 0; i < 300 * K; ++i) ap[i] = bf16_to_float(float_to_bf16(ap[i]));
          }
          for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 17, 25, 40, 63, 64, 128, 200, 255, 256, 300}) {  // widened from 64 / 256
            expect_same_bits(a, w, m, bf16_rows ? "bf16 rows" : "fp32 rows");
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  });
}

TEST(PackedDot, the_order_shows_in_signed_zeros_infinities_and_nan) {
  for_each_cpu_target([&](const std::string&) {
    for (int64_t K : {16, 32, 40, 64, 80}) {  // whole 32-element blocks (one, two), and a padded last block
      const int64_t n = 19;
      OwnedTensor a(DType::kF32, {6, K}), w(DType::kBF16, {n, K});
      fill_uniform(w.view(), 3, 1e-20f, 2e-20f);
      float* ap = static_cast<float*>(a.view().data());
      for (int64_t i = 0; i < 6 * K; ++i) ap[i] = -1e-30f;  // every product underflows to -0
      ap[1 * K + 3] = std::numeric_limits<float>::infinity();
      ap[2 * K + K - 1] = std::numeric_limits<float>::quiet_NaN();
      ap[3 * K + 5] = 1e30f;  // one row with a finite, non-zero sum
      expect_same_bits(a, w, 6, "signed zeros");
      if (::testing::Test::HasFatalFailure()) return;
      std::vector<float> out(static_cast<size_t>(6 * n));
      auto packed = ops::PackedWeights::pack(w.view());
      ops::detail::dot_packed_fn()(ap, K, 6, packed->words(), n, K, out.data(), n);
      // -0 from whole blocks; a padded last block's steps (0 x 0 added to -0) make it +0, as the contract says.
      EXPECT_EQ(out[0], 0.f);
      EXPECT_EQ(std::signbit(out[0]), K % 32 == 0) << "K " << K;
      EXPECT_TRUE(std::isinf(out[1 * n]));
      EXPECT_TRUE(std::isnan(out[2 * n]));
    }
  });
}

TEST(PackedDot, linear_with_packed_weights_gives_the_unpacked_bits_and_checks_the_copy) {
  const int64_t N = 75, K = 100;
  OwnedTensor x(DType::kBF16, {200, K}), w(DType::kBF16, {N, K}), bias(DType::kF32, {N});
  fill_uniform(x.view(), 1, -2.f, 2.f);
  fill_uniform(w.view(), 2, -0.5f, 0.5f);
  fill_uniform(bias.view(), 3, -1.f, 1.f);
  auto packed = ops::PackedWeights::pack(w.view());
  ASSERT_TRUE(packed.ok());
  for (int64_t M : {1, 7, 16, 64, 200}) {
    OwnedTensor want(DType::kBF16, {M, N}), got(DType::kBF16, {M, N});
    const TensorView b = bias.view();
    ASSERT_TRUE(ops::linear(x.view().slice0(0, M), w.view(), want.view(), &b).ok());
    ASSERT_TRUE(ops::linear(x.view().slice0(0, M), w.view(), got.view(), &b, &*packed).ok());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), static_cast<size_t>(M * N) * 2), 0) << "M " << M;
  }
  OwnedTensor y(DType::kF32, {4, N}), other(DType::kBF16, {N - 1, K}), wf(DType::kF32, {N, K});
  auto wrong = ops::PackedWeights::pack(other.view());
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(ops::linear(x.view().slice0(0, 4), w.view(), y.view(), nullptr, &*wrong).message(),
            "linear: packed holds [74, 100] but w is [75, 100]");
  EXPECT_EQ(ops::linear(x.view().slice0(0, 4), wf.view(), y.view(), nullptr, &*packed).message(),
            "linear: packed is given but w is fp32; only bf16 weights are packed");
}

TEST(PackedDot, pack_refuses_what_it_cannot_pack) {
  OwnedTensor f32(DType::kF32, {4, 8}), r3(DType::kBF16, {2, 4, 8});
  EXPECT_EQ(ops::PackedWeights::pack(f32.view()).status().message(),
            "pack_weights: w has dtype fp32; only bf16 weights are packed");
  EXPECT_EQ(ops::PackedWeights::pack(r3.view()).status().code(), StatusCode::kInvalidArgument);
  OwnedTensor w(DType::kBF16, {4, 8});
  const TensorView strided = TensorView::strided(w.view().data(), DType::kBF16, {4, 4}, {8, 2}, w.view().device());
  EXPECT_EQ(ops::PackedWeights::pack(strided).status().code(), StatusCode::kInvalidArgument);
  auto p = ops::PackedWeights::pack(w.view());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rows(), 4);
  EXPECT_EQ(p->cols(), 8);
  EXPECT_EQ(p->bytes(), 16u * 16 * 4);  // one panel: 16 lanes x one word per row (K = 8: one step pair) x 16 rows
}

}  // namespace
}  // namespace genbridge::testing
