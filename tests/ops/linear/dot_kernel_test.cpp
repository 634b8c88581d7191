// Internal kernel checks behind linear/linear and moe/expert_ffn: every path of the dispatched dot kernel
// (GEMV for 1..7 rows and in row chunks below kGemmMinRows, the packed GEMM from there, every tile
// remainder) gives, on every CPU target, the bits of an independent scalar implementation of the
// reduction-order contract (ops/common/linear/dot_kernel.h).
#include "ops/common/linear/dot_kernel.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "genbridge/core/formats.h"
#include "support/each_cpu_target.h"

namespace genbridge::testing {
namespace {

float widen(float v) { return v; }
float widen(bf16_t v) { return bf16_to_float(v); }
float widen(fp16_t v) { return fp16_to_float(v); }

// The contract, one scalar step at a time.
template <typename BT>
float contract_dot(const float* a, const BT* b, int64_t K) {
  float s[16] = {};
  const int64_t padded = (K + 15) / 16 * 16;
  for (int64_t k = 0; k < padded; ++k) {
    const float av = k < K ? a[k] : 0.f, bv = k < K ? widen(b[k]) : 0.f;
    s[k % 16] = std::fma(av, bv, s[k % 16]);
  }
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = s[i] + s[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

template <typename BT>
BT narrow(float v);
template <>
float narrow<float>(float v) {
  return v;
}
template <>
bf16_t narrow<bf16_t>(float v) {
  return float_to_bf16(v);
}
template <>
fp16_t narrow<fp16_t>(float v) {
  return float_to_fp16(v);
}

template <typename BT>
void check_dtype(DType dt) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  // Row counts: every GEMV row count, the GEMM's smallest, tile remainders of every target's tile.
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 15, 16, 17, 25, 37}) {
    for (int64_t K : {1, 15, 16, 17, 100, 1031}) {
      const int64_t n = 37, lda = K + 3, ldb = K + 5, ldo = n + 2;  // padded strides: nothing assumes dense rows
      std::vector<float> a(static_cast<size_t>(m * lda));
      std::vector<BT> b(static_cast<size_t>(n * ldb));
      for (float& v : a) v = d(rng) * 4.f;
      for (BT& v : b) v = narrow<BT>(d(rng));
      // A few exact zeros of both signs and products that cancel, so signed zeros reach the reduction.
      a[0] = -0.f;
      b[1] = narrow<BT>(0.f);
      std::vector<float> want(static_cast<size_t>(m * ldo), 0.f);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) want[r * ldo + c] = contract_dot(a.data() + r * lda, b.data() + c * ldb, K);
      for_each_cpu_target([&](const std::string& target) {
        std::vector<float> got(static_cast<size_t>(m * ldo), 0.f);
        ops::detail::dot_rows_fn(dt)(a.data(), lda, m, b.data(), ldb, n, K, got.data(), ldo);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c)
            ASSERT_EQ(std::bit_cast<uint32_t>(got[r * ldo + c]), std::bit_cast<uint32_t>(want[r * ldo + c]))
                << target << " " << dtype_name(dt) << " m " << m << " K " << K << " at " << r << ", " << c;
      });
    }
  }
}

TEST(DotKernel, every_path_gives_the_scalar_contract_bits_on_every_target_f32) { check_dtype<float>(DType::kF32); }
TEST(DotKernel, every_path_gives_the_scalar_contract_bits_on_every_target_bf16) { check_dtype<bf16_t>(DType::kBF16); }
TEST(DotKernel, every_path_gives_the_scalar_contract_bits_on_every_target_f16) { check_dtype<fp16_t>(DType::kF16); }

// Products that underflow to -0 leave -0 in every lane's chain; the padded steps turn -0 into +0
// (fma(0, 0, -0) = +0) exactly as the contract's zero-padded last block does, on the GEMV and the GEMM
// path alike (K = 16: -0; K = 17, 31: +0).
TEST(DotKernel, signed_zeros_follow_the_padded_contract_on_both_paths) {
  for (int64_t K : {16, 17, 31}) {
    std::vector<float> a(static_cast<size_t>((ops::detail::kGemmMinRows + 1) * K), -1e-30f),
        b(static_cast<size_t>(K), 1e-30f);
    const float want = contract_dot(a.data(), b.data(), K);
    ASSERT_EQ(std::signbit(want), K % 16 == 0);
    for_each_cpu_target([&](const std::string& target) {
      std::vector<float> one(1), many(ops::detail::kGemmMinRows + 1);
      ops::detail::dot_rows_fn(DType::kF32)(a.data(), K, 1, b.data(), K, 1, K, one.data(), 1);
      ops::detail::dot_rows_fn(DType::kF32)(a.data(), K, static_cast<int64_t>(many.size()), b.data(), K, 1, K,
                                            many.data(), 1);
      EXPECT_EQ(std::bit_cast<uint32_t>(one[0]), std::bit_cast<uint32_t>(want)) << target << " K " << K;
      for (float v : many) EXPECT_EQ(std::bit_cast<uint32_t>(v), std::bit_cast<uint32_t>(want)) << target << " K " << K;
    });
  }
}

}  // namespace
}  // namespace genbridge::testing
