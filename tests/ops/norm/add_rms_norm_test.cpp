// Contract test for norm/add_rms_norm; runs unchanged in every target build.
#include "norm_harness.h"

namespace genbridge::testing {
namespace {

GB_NORM_CONTRACT_TESTS(AddRmsNorm, NormKind::kAddRms, "add_rms_norm", "gamma")

// residual_sum may alias residual exactly: the residual stream is updated in place.
TEST(AddRmsNorm, in_place_residual_update) {
  OwnedTensor x(DType::kBF16, {3, 256}), g(DType::kBF16, {256}), r(DType::kBF16, {3, 256}), y1(DType::kBF16, {3, 256}),
      y2(DType::kBF16, {3, 256}), s(DType::kBF16, {3, 256});
  fill_uniform(x.view(), 1);
  fill_uniform(g.view(), 2);
  fill_uniform(r.view(), 3);
  ASSERT_TRUE(ops::add_rms_norm(x.view(), g.view(), r.view(), 1e-6f, y1.view(), s.view()).ok());
  ASSERT_TRUE(ops::add_rms_norm(x.view(), g.view(), r.view(), 1e-6f, y2.view(), r.view()).ok());
  EXPECT_EQ(y1.bytes(), y2.bytes());
  EXPECT_EQ(r.bytes(), s.bytes());
}

}  // namespace
}  // namespace genbridge::testing
