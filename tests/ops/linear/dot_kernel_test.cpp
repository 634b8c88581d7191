// Internal kernel checks behind linear/linear and moe/expert_ffn: the vectorised lane reduction gives
// vec::reduce_add's bits, and the tile kernel's arithmetic does not depend on the tile shape.
#include "ops/detail/linear/dot_kernel.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

namespace genbridge::testing {
namespace {

TEST(DotKernel, reduce16_equals_vec_reduce_add_bit_for_bit) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> mag(-30.f, 30.f);
  std::uniform_int_distribution<int> pick(0, 9);
  const float specials[] = {0.f, -0.f, INFINITY, -INFINITY, 1e-40f, -1e-40f, 3.4e38f, -3.4e38f, 1.f, -1.f};
  for (int trial = 0; trial < 20000; ++trial) {
    vec::f32x16 v;
    for (int l = 0; l < 16; ++l) {
      const int p = pick(rng);
      v[l] = p == 0 ? specials[rng() % 10] : std::ldexp(mag(rng), static_cast<int>(rng() % 40) - 20);
    }
    const float a = ops::detail::reduce16(v), b = vec::reduce_add(v);
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(b)) << "trial " << trial;
    }
  }
}

// One output element computed by every tile shape the dispatcher can pick gives one answer.
TEST(DotKernel, every_tile_shape_gives_the_same_bits) {
  const int64_t K = 1000, M = ops::detail::kTileRows, N = ops::detail::kTileCols;
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> a(static_cast<size_t>(M * K));
  std::vector<bf16_t> b(static_cast<size_t>(N * K));
  for (float& v : a) v = d(rng);
  for (bf16_t& v : b) v = float_to_bf16(d(rng));
  float full[ops::detail::kTileRows * ops::detail::kTileCols];
  ops::detail::dot_tile_rows<bf16_t, ops::detail::kTileCols>(static_cast<int>(M), a.data(), K, b.data(), K, K, nullptr,
                                                             0, true, true, full);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < N; ++c) {
      float one;
      ops::detail::dot_tile<bf16_t, 1, 1>(a.data() + r * K, K, b.data() + c * K, K, K, nullptr, 0, true, true, &one);
      ASSERT_EQ(std::bit_cast<uint32_t>(one), std::bit_cast<uint32_t>(full[r * N + c])) << r << ", " << c;
      // The same element through K blocks with the accumulators saved in between.
      vec::f32x16 acc;
      float split;
      ops::detail::dot_tile<bf16_t, 1, 1>(a.data() + r * K, K, b.data() + c * K, K, 512, &acc, 1, true, false, nullptr);
      ops::detail::dot_tile<bf16_t, 1, 1>(a.data() + r * K + 512, K, b.data() + c * K + 512, K, K - 512, &acc, 1, false,
                                          true, &split);
      ASSERT_EQ(std::bit_cast<uint32_t>(one), std::bit_cast<uint32_t>(split)) << r << ", " << c;
    }
}

}  // namespace
}  // namespace genbridge::testing
