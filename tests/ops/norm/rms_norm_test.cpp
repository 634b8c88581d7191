// Contract test for norm/rms_norm; runs unchanged in every target build.
#include "norm_harness.h"

namespace genbridge::testing {
namespace {

GB_NORM_CONTRACT_TESTS(RmsNorm, NormKind::kRms, "rms_norm", "gamma")

// A rank-2 gamma normalises over the two trailing dims: same result as flattening them.
TEST(RmsNorm, multi_dim_gamma_equals_flattened) {
  OwnedTensor x(DType::kBF16, {2, 3, 64}), g(DType::kBF16, {3, 64}), y2(DType::kBF16, {2, 3, 64}),
      y1(DType::kBF16, {2, 192}), r2(DType::kF32, {2, 1, 1}), r1(DType::kF32, {2, 1});
  fill_uniform(x.view(), 5);
  fill_uniform(g.view(), 6);
  ASSERT_TRUE(ops::rms_norm(x.view(), g.view(), 1e-6f, y2.view(), r2.view()).ok());
  ASSERT_TRUE(ops::rms_norm(TensorView(x.data(), DType::kBF16, {2, 192}), TensorView(g.data(), DType::kBF16, {192}),
                            1e-6f, y1.view(), r1.view()).ok());
  EXPECT_EQ(y1.bytes(), y2.bytes());
}

TEST(RmsNorm, zero_row_gives_zero_output_and_finite_rstd) {
  OwnedTensor x(DType::kBF16, {1, 128}), g(DType::kBF16, {128}), y(DType::kBF16, {1, 128}), r(DType::kF32, {1, 1});
  fill_uniform(g.view(), 1);
  ASSERT_TRUE(ops::rms_norm(x.view(), g.view(), 1e-6f, y.view(), r.view()).ok());
  EXPECT_TRUE(std::isfinite(r.view().data_as<float>()[0]));
  for (double v : to_doubles(y.view())) EXPECT_EQ(v, 0.0);
}

}  // namespace
}  // namespace genbridge::testing
