// linear/linear and moe/expert_ffn give the same bits on every CPU target and for every batch composition:
// row r of an M-row call equals the same row computed alone (batch invariance; the GEMM path taken from
// 16 rows equals the GEMV path below it, whole or in row chunks), with bf16, fp16 and fp32 weights, K not a multiple of
// 16 and N not a multiple of any target's tile. The reference bits are each row alone on the first target.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/moe/expert_ffn.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

constexpr int64_t kRowCounts[] = {1, 3, 7, 8, 9, 15, 16, 64, 200};
constexpr int64_t kMaxRows = 200;

// The first differing element of two float buffers, or -1.
int64_t first_difference(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return i;
  return -1;
}

class LinearBits : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(LinearBits, every_target_and_batch_size_gives_each_row_alone_bits) {
  const auto [wd, K] = GetParam();
  const int64_t N = 75;  // not a multiple of 16, 24 or 32 columns
  OwnedTensor x(DType::kF32, {kMaxRows, K}), w(wd, {N, K}), y(DType::kF32, {kMaxRows, N});
  fill_uniform(x.view(), 11, -2.f, 2.f);
  fill_uniform(w.view(), 12, -0.5f, 0.5f);
  // Reference: every row alone (the GEMV path) on the best target.
  std::vector<float> alone(static_cast<size_t>(kMaxRows * N));
  for (int64_t r = 0; r < kMaxRows; ++r) {
    OwnedTensor y1(DType::kF32, {1, N});
    ASSERT_TRUE(ops::linear(x.view().slice0(r, r + 1), w.view(), y1.view()).ok());
    std::memcpy(alone.data() + r * N, y1.data(), static_cast<size_t>(N) * sizeof(float));
  }
  for_each_cpu_target([&](const std::string& target) {
    for (int64_t M : kRowCounts) {
      std::memset(y.data(), 0xff, static_cast<size_t>(kMaxRows * N) * sizeof(float));
      ASSERT_TRUE(ops::linear(x.view().slice0(0, M), w.view(), y.view().slice0(0, M)).ok());
      const int64_t d = first_difference(static_cast<const float*>(y.data()), alone.data(), M * N);
      ASSERT_EQ(d, -1) << target << " " << dtype_name(wd) << " M " << M << " K " << K << ": y[" << d / N << ", "
                       << d % N << "] differs from that row alone";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(weights, LinearBits,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                                            ::testing::Values(int64_t{1000}, int64_t{1031})),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_K" +
                                  std::to_string(std::get<1>(info.param));
                         });

// expert_ffn: tokens routed to 4 experts, 2 each, so an expert's group has a few rows at small T (GEMV)
// and many more at large T (GEMM), in gate/up (K = H) and down (K = I) alike.
class ExpertFfnBits : public ::testing::TestWithParam<DType> {};

TEST_P(ExpertFfnBits, every_target_and_batch_size_gives_each_token_alone_bits) {
  const DType wdt = GetParam();
  const int64_t E = 4, k = 2, H = 1031, I = 40;
  OwnedTensor x(DType::kF32, {kMaxRows, H}), ids(DType::kI32, {kMaxRows, k}), wg(wdt, {E, I, H}), wu(wdt, {E, I, H}),
      wdn(wdt, {E, H, I}), out(DType::kF32, {kMaxRows, k, H});
  fill_uniform(x.view(), 21, -2.f, 2.f);
  fill_uniform(wg.view(), 22, -0.06f, 0.06f);
  fill_uniform(wu.view(), 23, -0.06f, 0.06f);
  fill_uniform(wdn.view(), 24, -0.15f, 0.15f);
  std::mt19937_64 rng(25);
  int32_t* idp = static_cast<int32_t*>(ids.data());
  for (int64_t t = 0; t < kMaxRows; ++t) {
    idp[t * k] = static_cast<int32_t>(rng() % E);
    idp[t * k + 1] = static_cast<int32_t>((idp[t * k] + 1 + rng() % (E - 1)) % E);
  }
  auto run = [&](int64_t t0, int64_t t1) {
    return ops::expert_ffn(x.view().slice0(t0, t1), ids.view().slice0(t0, t1), wg.view(), wu.view(), wdn.view(), 0, E,
                           out.view().slice0(t0, t1));
  };
  const int64_t row = k * H;
  std::vector<float> alone(static_cast<size_t>(kMaxRows * row));
  for (int64_t t = 0; t < kMaxRows; ++t) ASSERT_TRUE(run(t, t + 1).ok());
  std::memcpy(alone.data(), out.data(), alone.size() * sizeof(float));
  for_each_cpu_target([&](const std::string& target) {
    for (int64_t T : kRowCounts) {
      std::memset(out.data(), 0xff, alone.size() * sizeof(float));
      ASSERT_TRUE(run(0, T).ok());
      const int64_t d = first_difference(static_cast<const float*>(out.data()), alone.data(), T * row);
      ASSERT_EQ(d, -1) << target << " " << dtype_name(wdt) << " T " << T << ": out[" << d / row << ", " << d % row / H
                       << ", " << d % H << "] differs from that token alone";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(weights, ExpertFfnBits, ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace genbridge::testing
