// Contract test for norm/add_gemma_rms_norm; runs unchanged in every target build.
#include "norm_harness.h"

namespace genbridge::testing {
namespace {

GB_NORM_CONTRACT_TESTS(AddGemmaRmsNorm, NormKind::kAddGemma, "add_gemma_rms_norm", "w")

// The add_ variant normalises exactly what gemma_rms_norm would be given: the rounded residual sum.
TEST(AddGemmaRmsNorm, equals_add_then_gemma_rms_norm) {
  for (DType d : {DType::kBF16, DType::kF16}) {
    OwnedTensor x(d, {4, 1024}), w(d, {1024}), r(d, {4, 1024}), y1(d, {4, 1024}), s(d, {4, 1024}), y2(d, {4, 1024}),
        rstd(DType::kF32, {4, 1});
    fill_uniform(x.view(), 1);
    fill_uniform(w.view(), 2, -0.5f, 0.5f);
    fill_uniform(r.view(), 3);
    ASSERT_TRUE(ops::add_gemma_rms_norm(x.view(), w.view(), r.view(), 1e-6f, y1.view(), s.view()).ok());
    ASSERT_TRUE(ops::gemma_rms_norm(s.view(), w.view(), 1e-6f, y2.view(), rstd.view()).ok());
    EXPECT_EQ(y1.bytes(), y2.bytes());
  }
}

}  // namespace
}  // namespace genbridge::testing
