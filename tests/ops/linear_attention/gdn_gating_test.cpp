// Contract test for linear_attention/gdn_gating; runs unchanged in every target build.
#include "genbridge/ops/linear_attention/gdn_gating.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/linear_attention/linear_attention_ref.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

// The contract's fp32 formula, written out (this file is built with -ffp-contract=off too).
void formula(float a, float b, float A_log, float dt_bias, float& g, float& beta) {
  const float v = a + dt_bias;
  const float softplus = v > 20.0f ? v : std::log1p(std::exp(v));
  g = -std::exp(A_log) * softplus;
  beta = 1.0f / (1.0f + std::exp(-b));
}

void check(DType in, DType param, int64_t T, int64_t nv, float lo, float hi) {
  OwnedTensor a(in, {T, nv}), b(in, {T, nv}), A_log(param, {nv}), dt_bias(param, {nv}), g(DType::kF32, {T, nv}),
      beta(DType::kF32, {T, nv});
  fill_uniform(a.view(), 1, lo, hi);
  fill_uniform(b.view(), 2, lo, hi);
  fill_uniform(A_log.view(), 3, 0.f, 2.8f);  // log(1) .. log(16)
  fill_uniform(dt_bias.view(), 4, -0.5f, 0.5f);
  ASSERT_TRUE(ops::gdn_gating(a.view(), b.view(), A_log.view(), dt_bias.view(), g.view(), beta.view()).ok());
  const auto av = to_doubles(a.view()), bv = to_doubles(b.view()), Av = to_doubles(A_log.view()),
             dv = to_doubles(dt_bias.view()), gv = to_doubles(g.view()), betav = to_doubles(beta.view());
  std::vector<double> rg, rbeta;
  ref::gdn_gating(av, bv, Av, dv, T, nv, rg, rbeta);
  for (int64_t i = 0; i < T * nv; ++i) {
    float fg, fb;
    formula(static_cast<float>(av[i]), static_cast<float>(bv[i]), static_cast<float>(Av[i % nv]),
            static_cast<float>(dv[i % nv]), fg, fb);
    ASSERT_EQ(static_cast<float>(gv[i]), fg) << i;
    ASSERT_EQ(static_cast<float>(betav[i]), fb) << i;
    // A few fp32 roundings (plus expf/log1pf's ulp) relative; g near the softplus threshold jumps by
    // log1p(exp(-20)) ~ 2e-9 relative.
    ASSERT_NEAR(gv[i], rg[i], 1e-6 * std::abs(rg[i]) + 1e-30) << i;
    ASSERT_NEAR(betav[i], rbeta[i], 1e-6 * std::abs(rbeta[i]) + 1e-30) << i;
  }
}

TEST(GdnGating, matches_the_fp32_formula_and_fp64_reference) {
  for (DType in : {DType::kF32, DType::kBF16})
    for (DType param : {DType::kF32, DType::kBF16}) check(in, param, 37, 32, -8.f, 8.f);
  check(DType::kF32, DType::kF32, 20, 3, 15.f, 30.f);  // across softplus's threshold
  check(DType::kF32, DType::kF32, 20, 3, -100.f, -60.f);  // exp underflow: g -> -0, beta -> 0
  check(DType::kF32, DType::kF32, 0, 3, -1.f, 1.f);
  check(DType::kF32, DType::kF32, 3, 0, -1.f, 1.f);
}

TEST(GdnGating, strided_inputs_and_outputs_and_thread_counts) {
  OwnedTensor a(DType::kBF16, {500, 32}), b(DType::kBF16, {500, 32}), A_log(DType::kF32, {32}), dt(DType::kF32, {32});
  fill_uniform(a.view(), 5, -6.f, 6.f);
  fill_uniform(b.view(), 6, -6.f, 6.f);
  fill_uniform(A_log.view(), 7, 0.f, 2.8f);
  fill_uniform(dt.view(), 8, -0.5f, 0.5f);
  set_num_threads(1);
  OwnedTensor g1(DType::kF32, {500, 32}), b1(DType::kF32, {500, 32});
  ASSERT_TRUE(ops::gdn_gating(a.view(), b.view(), A_log.view(), dt.view(), g1.view(), b1.view()).ok());
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    OwnedTensor g(DType::kF32, {500, 32}), bb(DType::kF32, {500, 32});
    ASSERT_TRUE(ops::gdn_gating(a.view(), b.view(), A_log.view(), dt.view(), g.view(), bb.view()).ok());
    EXPECT_EQ(g.bytes(), g1.bytes());
    EXPECT_EQ(bb.bytes(), b1.bytes());
  }
  set_num_threads(0);
  // a and b as column views of one [T, 2 nv] projection row; g and beta transposed ([nv, T] storage).
  OwnedTensor ab(DType::kBF16, {500, 64}), gt(DType::kF32, {32, 500}), bt(DType::kF32, {32, 500});
  for (int64_t t = 0; t < 500; ++t)
    for (int64_t h = 0; h < 32; ++h) {
      ab.view().data_as<bf16_t>()[t * 64 + h] = a.view().data_as<bf16_t>()[t * 32 + h];
      ab.view().data_as<bf16_t>()[t * 64 + 32 + h] = b.view().data_as<bf16_t>()[t * 32 + h];
    }
  const auto* base = ab.view().data_as<bf16_t>();
  ASSERT_TRUE(ops::gdn_gating(TensorView::strided(const_cast<bf16_t*>(base), DType::kBF16, {500, 32}, {64, 1}),
                              TensorView::strided(const_cast<bf16_t*>(base + 32), DType::kBF16, {500, 32}, {64, 1}),
                              A_log.view(), dt.view(), TensorView::strided(gt.data(), DType::kF32, {500, 32}, {1, 500}),
                              TensorView::strided(bt.data(), DType::kF32, {500, 32}, {1, 500}))
                  .ok());
  for (int64_t t = 0; t < 500; ++t)
    for (int64_t h = 0; h < 32; ++h) {
      ASSERT_EQ(gt.view().data_as<float>()[h * 500 + t], g1.view().data_as<float>()[t * 32 + h]);
      ASSERT_EQ(bt.view().data_as<float>()[h * 500 + t], b1.view().data_as<float>()[t * 32 + h]);
    }
}

TEST(GdnGating, invalid_arguments) {
  OwnedTensor a(DType::kF32, {4, 8}), b(DType::kF32, {4, 8}), A(DType::kF32, {8}), dt(DType::kF32, {8}),
      g(DType::kF32, {4, 8}), beta(DType::kF32, {4, 8});
  fill_uniform(g.view(), 3);
  const auto g_before = g.bytes();
  auto expect_error = [&](const std::string& message, const TensorView& aa, const TensorView& bb, const TensorView& AA,
                          const TensorView& dd, const TensorView& gg, const TensorView& be) {
    const Status st = ops::gdn_gating(aa, bb, AA, dd, gg, be);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(g.bytes(), g_before) << message;
  };
  std::vector<float> f(64);
  expect_error("gdn_gating: a has rank 1 but must have rank 2 [T, nv]", TensorView(f.data(), DType::kF32, {8}), b.view(),
               A.view(), dt.view(), g.view(), beta.view());
  expect_error("gdn_gating: b has shape [4, 7] but must be [4, 8] (a's shape [T, nv])", a.view(),
               TensorView(f.data(), DType::kF32, {4, 7}), A.view(), dt.view(), g.view(), beta.view());
  expect_error("gdn_gating: A_log has shape [7] but must be [8] ([nv], a's last dimension)", a.view(), b.view(),
               TensorView(f.data(), DType::kF32, {7}), dt.view(), g.view(), beta.view());
  expect_error("gdn_gating: dt_bias has dtype fp16 but must be fp32 or bf16", a.view(), b.view(), A.view(),
               TensorView(f.data(), DType::kF16, {8}), g.view(), beta.view());
  expect_error("gdn_gating: g has dtype bf16 but must be fp32", a.view(), b.view(), A.view(), dt.view(),
               TensorView(f.data(), DType::kBF16, {4, 8}), beta.view());
  expect_error("gdn_gating: beta has shape [8, 4] but must be [4, 8] (a's shape [T, nv])", a.view(), b.view(), A.view(),
               dt.view(), g.view(), TensorView(f.data(), DType::kF32, {8, 4}));
  expect_error("gdn_gating: g overlaps a in memory; outputs must not alias inputs", a.view(), b.view(), A.view(),
               dt.view(), a.view(), beta.view());
  expect_error("gdn_gating: beta overlaps g in memory; outputs must not alias inputs", a.view(), b.view(), A.view(),
               dt.view(), g.view(), g.view());
}

}  // namespace
}  // namespace genbridge::testing
