// Contract test for norm/gated_rms_norm; runs unchanged in every target build.
#include "genbridge/ops/norm/gated_rms_norm.h"

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

// The contract's fp32 formula for one row, with the header's order of the sum of squares (this file is
// built with -ffp-contract=off too).
std::vector<float> formula(const std::vector<float>& x, const std::vector<float>& z, const std::vector<float>& w,
                           float eps, DType xd) {
  const int64_t d = static_cast<int64_t>(x.size()), whole = d / 16 * 16;
  float lane[16] = {};
  for (int64_t i = 0; i < whole; ++i) lane[i % 16] = lane[i % 16] + x[i] * x[i];
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = lane[i] + lane[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  float ss = (s4[0] + s4[2]) + (s4[1] + s4[3]);
  for (int64_t i = whole; i < d; ++i) ss = ss + x[i] * x[i];
  const float rs = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  std::vector<float> y(x.size());
  for (int64_t i = 0; i < d; ++i) {
    float n = x[i] * rs;
    if (xd == DType::kBF16) n = bf16_to_float(float_to_bf16(n));
    y[i] = (w[i] * n) * (z[i] / (1.0f + std::exp(-z[i])));
  }
  return y;
}

void check(DType xd, DType zd, DType wd, DType yd, int64_t rows, int64_t d) {
  OwnedTensor x(xd, {rows, d}), z(zd, {rows, d}), w(wd, {d}), y(yd, {rows, d});
  fill_uniform(x.view(), 1, -3.f, 3.f);
  fill_uniform(z.view(), 2, -6.f, 6.f);
  fill_uniform(w.view(), 3, 0.5f, 1.5f);
  const float eps = 1e-6f;
  ASSERT_TRUE(ops::gated_rms_norm(x.view(), z.view(), w.view(), eps, y.view()).ok());
  const auto xv = to_doubles(x.view()), zv = to_doubles(z.view()), wv = to_doubles(w.view()), got = to_doubles(y.view());
  std::vector<double> want;
  ref::gated_rms_norm(xv, zv, wv, rows, d, eps, want);
  const std::vector<float> wf(wv.begin(), wv.end());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> xr(xv.begin() + r * d, xv.begin() + (r + 1) * d), zr(zv.begin() + r * d, zv.begin() + (r + 1) * d);
    const std::vector<float> f = formula(xr, zr, wf, eps, xd);
    for (int64_t i = 0; i < d; ++i) {
      const float fy = yd == DType::kBF16 ? bf16_to_float(float_to_bf16(f[i])) : f[i];
      ASSERT_EQ(static_cast<float>(got[r * d + i]), fy) << r << ", " << i;
      // The sum of squares (d terms), the root and the steps after it; bf16 x adds n's rounding.
      const double tol = (d / 16.0 + 16) * 0x1p-24 * std::abs(want[r * d + i]) +
                         rounding_bound(xd, want[r * d + i]) + rounding_bound(yd, want[r * d + i]) + 1e-30;
      ASSERT_NEAR(got[r * d + i], want[r * d + i], tol) << r << ", " << i;
    }
  }
}

TEST(GatedRmsNorm, matches_the_fp32_formula_and_fp64_reference) {
  for (DType xd : {DType::kF32, DType::kBF16})
    for (DType zd : {DType::kF32, DType::kBF16})
      for (DType yd : {DType::kF32, DType::kBF16}) check(xd, zd, DType::kF32, yd, 9, 128);
  check(DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16, 3, 128);
  for (int64_t d : {1, 15, 16, 17, 33, 200}) check(DType::kBF16, DType::kBF16, DType::kF32, DType::kBF16, 4, d);
  check(DType::kF32, DType::kF32, DType::kF32, DType::kF32, 0, 128);
}

TEST(GatedRmsNorm, strided_rows_and_thread_counts) {
  // x: [T, nv, D] heads viewed from a wider buffer; z likewise; y contiguous.
  OwnedTensor xw(DType::kBF16, {50, 4, 256}), zw(DType::kBF16, {50, 4, 256}), w(DType::kF32, {128});
  fill_uniform(xw.view(), 4);
  fill_uniform(zw.view(), 5);
  fill_uniform(w.view(), 6);
  const TensorView xs = TensorView::strided(xw.data(), DType::kBF16, {50, 4, 128}, {1024, 256, 1});
  const TensorView zs = TensorView::strided(static_cast<bf16_t*>(zw.data()) + 128, DType::kBF16, {50, 4, 128},
                                            {1024, 256, 1});
  OwnedTensor xc(DType::kBF16, {50, 4, 128}), zc(DType::kBF16, {50, 4, 128});
  for (int64_t i = 0; i < 50 * 4 * 128; ++i) {
    xc.view().data_as<bf16_t>()[i] = xs.data_as<bf16_t>()[logical_offset(xs, i)];
    zc.view().data_as<bf16_t>()[i] = zs.data_as<bf16_t>()[logical_offset(zs, i)];
  }
  set_num_threads(1);
  OwnedTensor y1(DType::kBF16, {50, 4, 128});
  ASSERT_TRUE(ops::gated_rms_norm(xc.view(), zc.view(), w.view(), 1e-6f, y1.view()).ok());
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    OwnedTensor y(DType::kBF16, {50, 4, 128});
    ASSERT_TRUE(ops::gated_rms_norm(xs, zs, w.view(), 1e-6f, y.view()).ok());
    EXPECT_EQ(y.bytes(), y1.bytes());
  }
  set_num_threads(0);
}

TEST(GatedRmsNorm, invalid_arguments) {
  OwnedTensor x(DType::kF32, {2, 8}), z(DType::kF32, {2, 8}), w(DType::kF32, {8}), y(DType::kF32, {2, 8});
  fill_uniform(y.view(), 7);
  const auto before = y.bytes();
  auto expect_error = [&](const std::string& message, const TensorView& xv, const TensorView& zv, const TensorView& wv,
                          float eps, const TensorView& yv) {
    const Status st = ops::gated_rms_norm(xv, zv, wv, eps, yv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(y.bytes(), before) << message;
  };
  std::vector<uint16_t> h(64);
  expect_error("gated_rms_norm: x has dtype fp16 but must be fp32 or bf16", TensorView(h.data(), DType::kF16, {2, 8}),
               z.view(), w.view(), 1e-6f, y.view());
  expect_error("gated_rms_norm: z has shape [2, 4] but must be [2, 8] (x's shape)", x.view(),
               TensorView(z.data(), DType::kF32, {2, 4}), w.view(), 1e-6f, y.view());
  expect_error("gated_rms_norm: w has shape [4] but must be [8] ([D], x's last dimension)", x.view(), z.view(),
               TensorView(w.data(), DType::kF32, {4}), 1e-6f, y.view());
  expect_error("gated_rms_norm: eps is -1 but must be finite and >= 0", x.view(), z.view(), w.view(), -1.f, y.view());
  expect_error("gated_rms_norm: eps is inf but must be finite and >= 0", x.view(), z.view(), w.view(), INFINITY, y.view());
  expect_error("gated_rms_norm: y overlaps x in memory; outputs must not alias inputs", x.view(), z.view(), w.view(),
               1e-6f, x.view());
  expect_error("gated_rms_norm: y overlaps z in memory; outputs must not alias inputs", x.view(), z.view(), w.view(),
               1e-6f, z.view());
  expect_error("gated_rms_norm: x's last dimension is 0; D must be >= 1", TensorView(x.data(), DType::kF32, {2, 0}),
               TensorView(z.data(), DType::kF32, {2, 0}), TensorView(w.data(), DType::kF32, {0}), 1e-6f,
               TensorView(y.data(), DType::kF32, {2, 0}));
  expect_error("gated_rms_norm: x has stride 2 along its last dimension but must have unit stride there (contiguous rows)",
               TensorView::strided(x.data(), DType::kF32, {2, 4}, {8, 2}), TensorView(z.data(), DType::kF32, {2, 4}),
               TensorView(w.data(), DType::kF32, {4}), 1e-6f, TensorView(y.data(), DType::kF32, {2, 4}));
  expect_error("gated_rms_norm: x has rank 0 but must have rank >= 1 ([..., D])", TensorView(x.data(), DType::kF32, {}),
               z.view(), w.view(), 1e-6f, y.view());
}

}  // namespace
}  // namespace genbridge::testing
