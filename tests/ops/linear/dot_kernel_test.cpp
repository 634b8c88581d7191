// Internal kernel checks behind linear/linear and moe/expert_ffn: every path of the dispatched dot kernel
// (GEMV for 1..7 rows and in row chunks below kGemmMinRows, the packed GEMM from there, every tile
// remainder) gives, on every CPU target, the bits of an independent scalar implementation of the
// reduction-order contract (ops/common/linear/dot_kernel.h).
#include "ops/common/linear/dot_kernel.h"

#include <gtest/gtest.h>

#include <bit>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
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

// The bf16 contract (pair order, denormals flushed), one scalar step at a time, independent of the CPU's
// denormal mode: inputs that are denormal count as zeros, and a result that is tiny before rounding becomes a zero
// of its sign (decided exactly: the product is exact in double, and a two-sum gives the rounding error).
float daz(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.f, v) : v; }
float fma_ftz(float a, float b, float c) {
  a = daz(a);
  b = daz(b);
  c = daz(c);
  const float r = std::fma(a, b, c);
  const float lim = std::numeric_limits<float>::min();
  if (!std::isfinite(r) || std::fabs(r) > lim) return r;
  if (std::fabs(r) < lim) return std::copysign(0.f, r);
  const double p = static_cast<double>(a) * b, s = p + c, t = s - p, e = (p - (s - t)) + (c - t);
  // The exact sum is s + e (|r| is the smallest normal, so s is near it and e is exact).
  const bool tiny = std::fabs(s) < lim || (std::fabs(s) == lim && e != 0 && std::signbit(e) != std::signbit(s));
  return tiny ? std::copysign(0.f, r) : r;
}
float contract_dot_pairs(const float* a, const bf16_t* b, int64_t K) {
  float s[16] = {};
  const int64_t padded = (K + 31) / 32 * 32;
  for (int64_t k0 = 0; k0 < padded; k0 += 32)
    for (int64_t l = 0; l < 16; ++l)
      for (int64_t k : {k0 + 2 * l + 1, k0 + 2 * l}) {
        const float av = k < K ? a[k] : 0.f, bv = k < K ? bf16_to_float(b[k]) : 0.f;
        s[l] = fma_ftz(av, bv, s[l]);
      }
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = fma_ftz(1.f, s[i], s[i + 8]);
  for (int i = 0; i < 4; ++i) s4[i] = fma_ftz(1.f, s8[i], s8[i + 4]);
  return fma_ftz(1.f, fma_ftz(1.f, s4[0], s4[2]), fma_ftz(1.f, s4[1], s4[3]));
}
float contract_for(const float* a, const float* b, int64_t K) { return contract_dot(a, b, K); }
float contract_for(const float* a, const fp16_t* b, int64_t K) { return contract_dot(a, b, K); }
float contract_for(const float* a, const bf16_t* b, int64_t K) { return contract_dot_pairs(a, b, K); }

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
    for (int64_t K : {1, 15, 16, 17, 31, 32, 33, 64, 100, 1031}) {
      const int64_t n = 37, lda = K + 3, ldb = K + 5, ldo = n + 2;  // padded strides: nothing assumes dense rows
      std::vector<float> a(static_cast<size_t>(m * lda));
      std::vector<BT> b(static_cast<size_t>(n * ldb));
      // bf16 weights: odd row counts get input rows of bf16 values (the bf16 dot instruction's path, where the CPU
      // has one), even ones fp32 values.
      const bool bf16_rows = std::is_same_v<BT, bf16_t> && m % 2 == 1;
      for (float& v : a) v = bf16_rows ? bf16_to_float(float_to_bf16(d(rng) * 4.f)) : d(rng) * 4.f;
      for (BT& v : b) v = narrow<BT>(d(rng));
      // A few exact zeros of both signs and products that cancel, so signed zeros reach the reduction.
      a[0] = -0.f;
      b[1] = narrow<BT>(0.f);
      std::vector<float> want(static_cast<size_t>(m * ldo), 0.f);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) want[r * ldo + c] = contract_for(a.data() + r * lda, b.data() + c * ldb, K);
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

// bf16 weights and inputs around the denormal range: denormal inputs count as zeros, sums that are tiny before
// rounding become zeros (even those that would round up to the smallest normal), on every path and target, and the
// caller's denormal mode is left as it was.
TEST(DotKernel, bf16_denormals_and_tiny_sums_follow_the_flush_contract) {
  std::mt19937_64 rng(5);
  const float lim = std::numeric_limits<float>::min();
  auto tiny_bf16 = [&](int e_lo, int e_hi) {
    const int e = e_lo + static_cast<int>(rng() % static_cast<uint64_t>(e_hi - e_lo + 1));
    const float mant = 1.f + static_cast<float>(rng() % 128) / 128.f;
    return float_to_bf16((rng() % 2 ? -1.f : 1.f) * std::ldexp(mant, e));
  };
  int64_t tiny = 0, nonzero = 0;
  for (int64_t m : {1, 5, 16, 40}) {
    const int64_t K = 77, n = 19;
    std::vector<float> a(static_cast<size_t>(m * K));
    std::vector<bf16_t> b(static_cast<size_t>(n * K));
    // Rows whose products are all below the smallest normal (every sum flushed) and rows around it.
    for (int64_t i = 0; i < m * K; ++i) a[static_cast<size_t>(i)] = bf16_to_float(i / K % 3 == 2 ? tiny_bf16(-80, -70) : tiny_bf16(-68, -58));
    for (bf16_t& v : b) v = tiny_bf16(-68, -60);
    // Denormal inputs on both sides (bf16 denormals are fp32 denormals).
    for (int64_t i = 0; i < m * K; i += 7) a[static_cast<size_t>(i)] = std::ldexp(1.f, -130);
    for (int64_t i = 3; i < n * K; i += 11) b[static_cast<size_t>(i)] = float_to_bf16(-std::ldexp(1.5f, -128));
    std::vector<float> want(static_cast<size_t>(m * n));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        want[r * n + c] = contract_dot_pairs(a.data() + r * K, b.data() + c * K, K);
        tiny += want[r * n + c] == 0.f;
        nonzero += want[r * n + c] != 0.f;
      }
    for_each_cpu_target([&](const std::string& target) {
      std::fenv_t before;
      ASSERT_EQ(std::fegetenv(&before), 0);
      const float denormal = lim / 4;
      std::vector<float> got(static_cast<size_t>(m * n));
      ops::detail::dot_rows_fn(DType::kBF16)(a.data(), K, m, b.data(), K, n, K, got.data(), n);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i])) << target << " m " << m << " at " << i;
      // Denormals still work on the calling thread afterwards.
      volatile float half = 0.5f;
      EXPECT_EQ(denormal * half, lim / 8) << target;
    });
  }
  EXPECT_GT(tiny, 0) << "the data must produce flushed sums";
  EXPECT_GT(nonzero, 0);
  // Lane 0 reaches 2^-126 + 2^-149 in the first block, then adds -1.5 * 2^-149: the exact sum lies just below the
  // smallest normal and would round up to it, but is tiny before rounding, so it is flushed (+0).
  std::vector<float> a(64, 0.f);
  std::vector<bf16_t> b(64, float_to_bf16(0.f));
  a[1] = std::ldexp(1.f, -63), b[1] = float_to_bf16(std::ldexp(1.f, -63));
  a[0] = std::ldexp(1.f, -75), b[0] = float_to_bf16(std::ldexp(1.f, -74));
  a[33] = std::ldexp(1.5f, -75), b[33] = float_to_bf16(-std::ldexp(1.f, -74));
  const float want = contract_dot_pairs(a.data(), b.data(), 64);
  ASSERT_EQ(std::bit_cast<uint32_t>(want), 0u);
  for_each_cpu_target([&](const std::string& target) {
    float got = -1.f;
    ops::detail::dot_rows_fn(DType::kBF16)(a.data(), 64, 1, b.data(), 64, 1, 64, &got, 1);
    EXPECT_EQ(std::bit_cast<uint32_t>(got), 0u) << target;
  });
}

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
