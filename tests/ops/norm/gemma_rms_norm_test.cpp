// Contract test for norm/gemma_rms_norm; runs unchanged in every target build.
#include "norm_harness.h"

namespace genbridge::testing {
namespace {

GB_NORM_CONTRACT_TESTS(GemmaRmsNorm, NormKind::kGemma, "gemma_rms_norm", "w")

// In fp32 there is nothing to round: the op equals rms_norm with gamma = 1 + w on every target.
TEST(GemmaRmsNorm, fp32_equals_rms_norm_of_one_plus_w) {
  OwnedTensor x(DType::kF32, {4, 512}), w(DType::kF32, {512}), g(DType::kF32, {512}), y1(DType::kF32, {4, 512}),
      y2(DType::kF32, {4, 512}), r1(DType::kF32, {4, 1}), r2(DType::kF32, {4, 1});
  fill_uniform(x.view(), 8);
  fill_uniform(w.view(), 9, -0.5f, 0.5f);
  for (int i = 0; i < 512; ++i) g.view().data_as<float>()[i] = 1.0f + w.view().data_as<float>()[i];
  ASSERT_TRUE(ops::gemma_rms_norm(x.view(), w.view(), 1e-6f, y1.view(), r1.view()).ok());
  ASSERT_TRUE(ops::rms_norm(x.view(), g.view(), 1e-6f, y2.view(), r2.view()).ok());
  EXPECT_EQ(y1.bytes(), y2.bytes());
}

TEST(GemmaRmsNorm, default_eps_is_one_in_a_million) { EXPECT_EQ(ops::kGemmaRmsNormDefaultEps, 1e-6f); }

}  // namespace
}  // namespace genbridge::testing
