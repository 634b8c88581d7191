// Contract test for activation/sigmoid_mul; runs unchanged in every target build.
#include "genbridge/ops/activation/sigmoid_mul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/linear_attention/linear_attention_ref.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

// The contract's fp32 formula, written out (this file is built with -ffp-contract=off too).
float formula(float x, float gate) { return x * (1.0f / (1.0f + std::exp(-gate))); }

void check(DType xd, DType gd, DType yd, int64_t rows, int64_t d) {
  OwnedTensor x(xd, {rows, d}), gate(gd, {rows, d}), y(yd, {rows, d});
  fill_uniform(x.view(), 1, -8.f, 8.f);
  fill_uniform(gate.view(), 2, -20.f, 20.f);
  ASSERT_TRUE(ops::sigmoid_mul(x.view(), gate.view(), y.view()).ok());
  const auto xv = to_doubles(x.view()), gv = to_doubles(gate.view()), got = to_doubles(y.view());
  std::vector<double> want;
  ref::sigmoid_mul(xv, gv, want);
  for (size_t i = 0; i < want.size(); ++i) {
    const float f = formula(static_cast<float>(xv[i]), static_cast<float>(gv[i]));
    ASSERT_EQ(static_cast<float>(got[i]), yd == DType::kBF16 ? bf16_to_float(float_to_bf16(f)) : f) << i;
    ASSERT_NEAR(got[i], want[i], 6 * 0x1p-24 * std::abs(want[i]) + rounding_bound(yd, want[i]) + 1e-38) << i;
  }
}

TEST(SigmoidMul, matches_the_fp32_formula_and_fp64_reference) {
  for (DType xd : {DType::kF32, DType::kBF16})
    for (DType gd : {DType::kF32, DType::kBF16})
      for (DType yd : {DType::kF32, DType::kBF16}) check(xd, gd, yd, 5, 75);
  check(DType::kBF16, DType::kBF16, DType::kBF16, 1, 1);
  check(DType::kF32, DType::kF32, DType::kF32, 0, 16);
  check(DType::kF32, DType::kF32, DType::kF32, 3, 0);
}

TEST(SigmoidMul, gate_as_a_view_into_a_wider_row_and_in_place) {
  // Qwen3.5's [q | gate] head rows: the gate is the second half of each row; the attention output x is
  // gated in place.
  OwnedTensor qg(DType::kBF16, {6, 4, 2 * 40}), x(DType::kBF16, {6, 4, 40}), g(DType::kBF16, {6, 4, 40}),
      want(DType::kBF16, {6, 4, 40});
  fill_uniform(qg.view(), 3, -5.f, 5.f);
  fill_uniform(x.view(), 4, -5.f, 5.f);
  auto* base = qg.view().data_as<bf16_t>();
  const TensorView gs = TensorView::strided(base + 40, DType::kBF16, {6, 4, 40}, {320, 80, 1});
  for (int64_t i = 0; i < 6 * 4 * 40; ++i) g.view().data_as<bf16_t>()[i] = gs.data_as<bf16_t>()[logical_offset(gs, i)];
  ASSERT_TRUE(ops::sigmoid_mul(x.view(), g.view(), want.view()).ok());
  ASSERT_TRUE(ops::sigmoid_mul(x.view(), gs, x.view()).ok());
  EXPECT_EQ(x.bytes(), want.bytes());
  // A strided output (every other element of a wider buffer).
  OwnedTensor wide(DType::kF32, {6, 4, 80});
  const TensorView ys = TensorView::strided(wide.data(), DType::kF32, {6, 4, 40}, {320, 80, 2});
  OwnedTensor x2(DType::kBF16, {6, 4, 40});
  fill_uniform(x2.view(), 4, -5.f, 5.f);
  ASSERT_TRUE(ops::sigmoid_mul(x2.view(), gs, ys).ok());
  const auto got = to_doubles(ys), w = to_doubles(want.view());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(static_cast<float>(w[i]), bf16_to_float(float_to_bf16(static_cast<float>(got[i]))));
}

TEST(SigmoidMul, extreme_gates_and_thread_counts) {
  std::vector<float> x = {3.f, 3.f, -2.f, INFINITY, 5.f}, gate = {-200.f, 200.f, 0.f, 1.f, NAN}, y(5);
  ASSERT_TRUE(ops::sigmoid_mul(TensorView(x.data(), DType::kF32, {5}), TensorView(gate.data(), DType::kF32, {5}),
                               TensorView(y.data(), DType::kF32, {5}))
                  .ok());
  EXPECT_EQ(y[0], 0.f);
  EXPECT_EQ(y[1], 3.f);
  EXPECT_EQ(y[2], -1.f);
  EXPECT_EQ(y[3], INFINITY);
  EXPECT_TRUE(std::isnan(y[4]));
  OwnedTensor xb(DType::kBF16, {300, 1000}), gb(DType::kBF16, {300, 1000});
  fill_uniform(xb.view(), 4);
  fill_uniform(gb.view(), 5);
  set_num_threads(1);
  OwnedTensor y1(DType::kBF16, {300, 1000});
  ASSERT_TRUE(ops::sigmoid_mul(xb.view(), gb.view(), y1.view()).ok());
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    OwnedTensor yt(DType::kBF16, {300, 1000});
    ASSERT_TRUE(ops::sigmoid_mul(xb.view(), gb.view(), yt.view()).ok());
    EXPECT_EQ(yt.bytes(), y1.bytes());
  }
  set_num_threads(0);
  float s = 2.f, sg = 0.f, sy = 0.f;  // rank 0
  ASSERT_TRUE(ops::sigmoid_mul(TensorView(&s, DType::kF32, {}), TensorView(&sg, DType::kF32, {}),
                               TensorView(&sy, DType::kF32, {}))
                  .ok());
  EXPECT_EQ(sy, 1.f);
}

TEST(SigmoidMul, invalid_arguments) {
  OwnedTensor x(DType::kF32, {2, 8}), g(DType::kF32, {2, 8}), y(DType::kF32, {2, 8});
  fill_uniform(y.view(), 6);
  const auto before = y.bytes();
  auto expect_error = [&](const std::string& message, const TensorView& xv, const TensorView& gv, const TensorView& yv) {
    const Status st = ops::sigmoid_mul(xv, gv, yv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(y.bytes(), before) << message;
  };
  std::vector<uint16_t> h(16);
  expect_error("sigmoid_mul: x has dtype fp16 but must be fp32 or bf16", TensorView(h.data(), DType::kF16, {2, 8}),
               g.view(), y.view());
  expect_error("sigmoid_mul: gate has shape [2, 4] but must be [2, 8] (x's shape)", x.view(),
               TensorView(g.data(), DType::kF32, {2, 4}), y.view());
  expect_error("sigmoid_mul: y has shape [16] but must be [2, 8] (x's shape)", x.view(), g.view(),
               TensorView(y.data(), DType::kF32, {16}));
  expect_error("sigmoid_mul: y overlaps gate in memory; outputs must not alias inputs", x.view(), g.view(), g.view());
  expect_error(
      "sigmoid_mul: y overlaps x in memory but is not x itself; y may alias x exactly (in place) or not at all",
      x.view(), g.view(), TensorView(static_cast<float*>(x.data()) + 1, DType::kF32, {2, 8}));
  expect_error(
      "sigmoid_mul: y overlaps x in memory but is not x itself; y may alias x exactly (in place) or not at all",
      x.view(), g.view(), TensorView(x.data(), DType::kBF16, {2, 8}));
}

}  // namespace
}  // namespace genbridge::testing
