// Contract test for activation/silu_and_mul; runs unchanged in every target build.
#include "genbridge/ops/activation/silu_and_mul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/linear/linear_ref.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

// The contract's fp32 formula, written out (this file is built with -ffp-contract=off too).
float silu_mul_f32(float g, float u) { return (g / (1.0f + std::exp(-g))) * u; }

void run_and_check(DType xd, DType yd, int64_t rows, int64_t d) {
  OwnedTensor x(xd, {rows, 2 * d}), y(yd, {rows, d});
  fill_uniform(x.view(), 3, -8.f, 8.f);
  const auto before = x.bytes();
  ASSERT_TRUE(ops::silu_and_mul(x.view(), y.view()).ok());
  EXPECT_EQ(x.bytes(), before) << "x was mutated";
  const std::vector<double> in = to_doubles(x.view()), got = to_doubles(y.view());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d; ++i) {
      const double g = in[r * 2 * d + i], u = in[r * 2 * d + d + i];
      const double want = ref::silu(g) * u;
      const float exact_formula = silu_mul_f32(static_cast<float>(g), static_cast<float>(u));
      float rounded = exact_formula;
      if (yd == DType::kBF16) rounded = bf16_to_float(float_to_bf16(exact_formula));
      if (yd == DType::kF16) rounded = fp16_to_float(float_to_fp16(exact_formula));
      ASSERT_EQ(static_cast<float>(got[r * d + i]), rounded) << r << ", " << i;
      ASSERT_NEAR(got[r * d + i], want, 8 * 0x1p-24 * (std::abs(want) + std::abs(u)) + rounding_bound(yd, want));
    }
}

TEST(SiluAndMul, matches_fp64_reference_and_the_fp32_formula) {
  for (DType xd : {DType::kF32, DType::kBF16, DType::kF16})
    for (DType yd : {DType::kF32, DType::kBF16, DType::kF16}) run_and_check(xd, yd, 7, 100);
  run_and_check(DType::kBF16, DType::kBF16, 1, 1);
}

TEST(SiluAndMul, extreme_gates) {
  std::vector<float> x = {-200.f, 200.f, 0.f, -0.f, INFINITY, 1.f, 1.f, 1.f, 1.f, 1.f}, y(5);
  ASSERT_TRUE(ops::silu_and_mul(TensorView(x.data(), DType::kF32, {10}), TensorView(y.data(), DType::kF32, {5})).ok());
  EXPECT_EQ(y[0], -0.f);
  EXPECT_EQ(y[1], 200.f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_EQ(y[4], INFINITY);
}

TEST(SiluAndMul, strided_input_and_output) {
  OwnedTensor x(DType::kBF16, {3, 2, 64}), y(DType::kF32, {3, 2, 32}), xs(DType::kBF16, {3, 2, 128}),
      ys(DType::kF32, {3, 2, 64});
  fill_uniform(x.view(), 4);
  ASSERT_TRUE(ops::silu_and_mul(x.view(), y.view()).ok());
  const TensorView xv = TensorView::strided(xs.data(), DType::kBF16, {3, 2, 64}, {256, 128, 2});
  const TensorView yv = TensorView::strided(ys.data(), DType::kF32, {3, 2, 32}, {128, 64, 2});
  for (int64_t i = 0; i < 3 * 2 * 64; ++i) xv.data_as<bf16_t>()[logical_offset(xv, i)] = x.view().data_as<bf16_t>()[i];
  ASSERT_TRUE(ops::silu_and_mul(xv, yv).ok());
  EXPECT_EQ(to_doubles(yv), to_doubles(y.view()));
}

TEST(SiluAndMul, bit_identical_across_thread_counts) {
  OwnedTensor x(DType::kBF16, {300, 1536});
  fill_uniform(x.view(), 5);
  set_num_threads(1);
  OwnedTensor y1(DType::kBF16, {300, 768});
  ASSERT_TRUE(ops::silu_and_mul(x.view(), y1.view()).ok());
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    OwnedTensor y(DType::kBF16, {300, 768});
    ASSERT_TRUE(ops::silu_and_mul(x.view(), y.view()).ok());
    EXPECT_EQ(y.bytes(), y1.bytes());
  }
  set_num_threads(0);
}

TEST(SiluAndMul, empty_inputs) {
  OwnedTensor x(DType::kF32, {0, 8}), y(DType::kF32, {0, 4});
  EXPECT_TRUE(ops::silu_and_mul(x.view(), y.view()).ok());
  OwnedTensor x0(DType::kF32, {3, 0}), y0(DType::kF32, {3, 0});
  EXPECT_TRUE(ops::silu_and_mul(x0.view(), y0.view()).ok());
}

TEST(SiluAndMul, invalid_arguments) {
  OwnedTensor x(DType::kF32, {2, 8}), y(DType::kF32, {2, 4});
  fill_uniform(y.view(), 6);
  const auto before = y.bytes();
  auto expect_error = [&](const std::string& message, const TensorView& xv, const TensorView& yv) {
    const Status st = ops::silu_and_mul(xv, yv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(y.bytes(), before) << "y written on error: " << message;
  };
  std::vector<int32_t> i32(16);
  expect_error("silu_and_mul: x has dtype int32 but must be fp32, fp16 or bf16", TensorView(i32.data(), DType::kI32, {2, 8}),
               y.view());
  expect_error("silu_and_mul: x's last dimension is 7 but must be even ([gate | up], 2d elements)",
               TensorView(x.data(), DType::kF32, {2, 7}), y.view());
  expect_error("silu_and_mul: y has shape [2, 8] but must be [2, 4] (x's leading shape + [d], d = half x's last dimension)",
               x.view(), TensorView(y.data(), DType::kF32, {2, 8}));
  expect_error("silu_and_mul: y has dtype int32 but must be fp32, fp16 or bf16", x.view(),
               TensorView(i32.data(), DType::kI32, {2, 4}));
  expect_error("silu_and_mul: y overlaps x in memory; outputs must not alias inputs", x.view(),
               TensorView(x.data(), DType::kF32, {2, 4}));
  expect_error("silu_and_mul: x has rank 0 but must have rank >= 1 ([..., 2d])", TensorView(x.data(), DType::kF32, {}),
               y.view());
}

}  // namespace
}  // namespace genbridge::testing
