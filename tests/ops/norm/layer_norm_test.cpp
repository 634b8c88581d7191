// Contract test for norm/layer_norm against the fp64 reference; runs unchanged in every target build.
#include "genbridge/ops/norm/layer_norm.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "ops/common/attention/mla_ref.h"
#include "support/each_cpu_target.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

std::vector<float> rnd(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

TEST(LayerNorm, matches_reference_with_bias_every_dtype_and_a_tail) {
  for (int64_t D : {128, 37}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const int64_t rows = 5;
      auto x = rnd(rows * D, 1, -3.f, 5.f), g = rnd(D, 2, 0.5f, 1.5f), b = rnd(D, 3, -1.f, 1.f);
      OwnedTensor xt(dt, {rows, D}), yt(dt, {rows, D});
      for (int64_t i = 0; i < rows * D; ++i) set_element(xt.view(), i, x[i]);
      ASSERT_TRUE(ops::layer_norm(xt.view(), TensorView(g.data(), DType::kF32, {D}),
                                  TensorView(b.data(), DType::kF32, {D}), 1e-6f, yt.view())
                      .ok());
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> xr(static_cast<size_t>(D));
        for (int64_t i = 0; i < D; ++i) xr[i] = element_as_double(xt.view(), r * D + i);
        const auto want = ref::layer_norm(xr, std::vector<double>(g.begin(), g.end()),
                                          std::vector<double>(b.begin(), b.end()), 1e-6);
        const double tol = dt == DType::kF32 ? 1e-5 : 2e-2;
        for (int64_t i = 0; i < D; ++i) {
          EXPECT_NEAR(element_as_double(yt.view(), r * D + i), want[i], tol * (1 + std::fabs(want[i])));
        }
      }
    }
  }
}

TEST(LayerNorm, in_place_same_bits_on_every_cpu_target_and_bad_arguments) {
  const int64_t D = 100;
  const auto x0 = rnd(3 * D, 4, -2.f, 2.f), g = rnd(D, 5, 0.5f, 1.5f), b = rnd(D, 6, -1.f, 1.f);
  std::vector<float> first;
  for_each_cpu_target([&](const std::string&) {
    std::vector<float> x = x0;
    const TensorView xv(x.data(), DType::kF32, {3, D});
    ASSERT_TRUE(ops::layer_norm(xv, TensorView(const_cast<float*>(g.data()), DType::kF32, {D}),
                                TensorView(const_cast<float*>(b.data()), DType::kF32, {D}), 1e-5f, xv)
                    .ok());
    if (first.empty()) first = x;
    EXPECT_EQ(0, std::memcmp(x.data(), first.data(), x.size() * sizeof(float)));
  });
  std::vector<float> x = x0, y(3 * D);
  const Status st = ops::layer_norm(TensorView(x.data(), DType::kF32, {3, D}),
                                    TensorView(const_cast<float*>(g.data()), DType::kF32, {D - 1}),
                                    TensorView(const_cast<float*>(b.data()), DType::kF32, {D}), 1e-5f,
                                    TensorView(y.data(), DType::kF32, {3, D}));
  EXPECT_EQ(st.message(), "layer_norm: gamma has shape [99] but must be [100] (x's last dimension)");
}

}  // namespace
}  // namespace genbridge::testing
