// Contract test for residual/hyper_connection (hc_pre, hc_post, hc_head: DeepSeek-V4's mHC); runs unchanged in
// every target build.
#include "genbridge/ops/residual/hyper_connection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "genbridge/ops/linear/linear.h"
#include "ops/common/residual/hyper_connection_ref.h"
#include "support/fp32_bounds.h"
#include "support/tensor_util.h"

namespace genbridge::testing {
namespace {

using ops::HyperConnectionParams;

// One mHC site's inputs: streams [T, n, H] and, for hc_pre (head = false) or hc_head, fn, base and scale.
struct Site {
  int64_t T, n, H, N;
  OwnedTensor streams, fn, base, scale;
  Site(int64_t T_, int64_t n_, int64_t H_, DType sd, uint64_t seed, bool head = false)
      : T(T_),
        n(n_),
        H(H_),
        N(head ? n_ : (2 + n_) * n_),
        streams(sd, {T_, n_, H_}),
        fn(DType::kF32, {N, n_ * H_}),
        base(DType::kF32, {N}),
        scale(DType::kF32, {head ? 1 : 3}) {
    fill_uniform(streams.view(), seed, -3.f, 3.f);
    const float a = 2.0f / std::sqrt(static_cast<float>(n * H));
    fill_uniform(fn.view(), seed + 1, -a, a);
    fill_uniform(base.view(), seed + 2, -1.f, 1.f);
    fill_uniform(scale.view(), seed + 3, 0.5f, 2.f);
  }
};

struct PreOut {
  OwnedTensor collapsed, post, comb;
  PreOut(int64_t T, int64_t n, int64_t H, DType cd)
      : collapsed(cd, {T, H}), post(DType::kF32, {T, n}), comb(DType::kF32, {T, n, n}) {}
};

Status run_pre(Site& s, const HyperConnectionParams& p, PreOut& o) {
  return ops::hc_pre(s.streams.view(), s.fn.view(), s.base.view(), s.scale.view(), p, o.collapsed.view(), o.post.view(),
                     o.comb.view());
}

// The fp32 contract of hc_pre / hc_head written out on this side: x . x and fn . x from linear/linear (the
// reduction order the contract names), then the scalar formulas, each operation rounded once.
struct Fp32Pre {
  std::vector<float> pre, post, comb, collapsed;  // collapsed in fp32, before the final rounding
};
Fp32Pre fp32_contract(Site& s, int64_t t, const HyperConnectionParams& p, bool head) {
  const int64_t n = s.n, H = s.H, K = n * H;
  std::vector<float> x(static_cast<size_t>(K)), d(static_cast<size_t>(s.N)), b(static_cast<size_t>(s.N));
  const std::vector<double> xs = to_doubles(s.streams.view().slice0(t, t + 1));
  for (int64_t k = 0; k < K; ++k) x[k] = static_cast<float>(xs[k]);
  float ss = 0.0f;
  EXPECT_TRUE(ops::linear(TensorView(x.data(), DType::kF32, {1, K}), TensorView(x.data(), DType::kF32, {1, K}),
                          TensorView(&ss, DType::kF32, {1, 1}))
                  .ok());
  EXPECT_TRUE(
      ops::linear(TensorView(x.data(), DType::kF32, {1, K}), s.fn.view(), TensorView(d.data(), DType::kF32, {1, s.N}))
          .ok());
  const float r = 1.0f / std::sqrt(ss / static_cast<float>(K) + p.norm_eps);
  const float* sc = s.scale.view().data_as<float>();
  const float* bs = s.base.view().data_as<float>();
  auto sigmoid = [](float v) { return 1.0f / (1.0f + std::exp(-v)); };
  std::vector<float> m(static_cast<size_t>(s.N));
  for (int64_t i = 0; i < s.N; ++i) m[i] = r * d[i];
  Fp32Pre o;
  for (int64_t j = 0; j < n; ++j) o.pre.push_back(sigmoid(m[j] * sc[0] + bs[j]) + p.hc_eps);
  if (!head) {
    for (int64_t j = 0; j < n; ++j) o.post.push_back(2.0f * sigmoid(m[n + j] * sc[1] + bs[n + j]));
    std::vector<float>& c = o.comb;
    c.resize(static_cast<size_t>(n * n));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < n; ++k) c[j * n + k] = m[2 * n + j * n + k] * sc[2] + bs[2 * n + j * n + k];
      float mx = c[j * n];
      for (int64_t k = 1; k < n; ++k) mx = c[j * n + k] > mx ? c[j * n + k] : mx;
      float sum = 0.0f;
      for (int64_t k = 0; k < n; ++k) {
        c[j * n + k] = std::exp(c[j * n + k] - mx);
        sum += c[j * n + k];
      }
      for (int64_t k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / sum + p.hc_eps;
    }
    auto columns = [&] {
      for (int64_t k = 0; k < n; ++k) {
        float sum = 0.0f;
        for (int64_t j = 0; j < n; ++j) sum += c[j * n + k];
        for (int64_t j = 0; j < n; ++j) c[j * n + k] = c[j * n + k] / (sum + p.hc_eps);
      }
    };
    columns();
    for (int64_t it = 1; it < p.sinkhorn_iters; ++it) {
      for (int64_t j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int64_t k = 0; k < n; ++k) sum += c[j * n + k];
        for (int64_t k = 0; k < n; ++k) c[j * n + k] = c[j * n + k] / (sum + p.hc_eps);
      }
      columns();
    }
  }
  for (int64_t h = 0; h < H; ++h) {
    float acc = 0.0f;
    for (int64_t j = 0; j < n; ++j) acc = std::fma(o.pre[j], x[j * H + h], acc);
    o.collapsed.push_back(acc);
  }
  return o;
}

float rounded(float v, DType d) { return d == DType::kBF16 ? bf16_to_float(float_to_bf16(v)) : v; }

// hc_pre against the fp64 oracle: post and comb within what the fp32 dot products' error can move them
// (sigmoid' <= 1/4, softmax and Sinkhorn mildly amplify it), collapsed within pre's error times the streams
// plus one rounding.
void check_pre_against_reference(Site& s, const HyperConnectionParams& p, PreOut& o) {
  const std::vector<double> x = to_doubles(s.streams.view()), fn = to_doubles(s.fn.view()),
                            base = to_doubles(s.base.view()), scale = to_doubles(s.scale.view()),
                            col = to_doubles(o.collapsed.view()), post = to_doubles(o.post.view()),
                            comb = to_doubles(o.comb.view());
  const int64_t n = s.n, H = s.H, K = n * H;
  for (int64_t t = 0; t < s.T; ++t) {
    std::vector<double> pre, rpost, rcomb, rcol;
    const double* xt = x.data() + t * K;
    ref::hc_pre_token(xt, n, H, fn.data(), base.data(), scale.data(), p.norm_eps, p.hc_eps, p.sinkhorn_iters, pre,
                      rpost, rcomb, rcol);
    double ss = 0, xmax = 0;
    for (int64_t k = 0; k < K; ++k) {
      ss += xt[k] * xt[k];
      xmax = std::max(xmax, std::abs(xt[k]));
    }
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(K) + p.norm_eps);
    double m_err = 0;  // the largest error bound of a mix m[i] (dot order, r's error, the product)
    for (int64_t i = 0; i < s.N; ++i) {
      double abs_sum = 0, m = 0;
      for (int64_t k = 0; k < K; ++k) {
        abs_sum += std::abs(fn[i * K + k] * xt[k]);
        m += fn[i * K + k] * xt[k];
      }
      m_err = std::max(m_err, r * dot_error_bound(K, abs_sum) + 8 * 0x1p-24 * std::abs(r * m));
    }
    const double smax = std::max({scale[0], scale.size() > 1 ? scale[1] : 0.0, scale.size() > 2 ? scale[2] : 0.0});
    const double pre_tol = 0.25 * smax * m_err + 8 * 0x1p-24;
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_NEAR(post[t * n + j], rpost[j], 2 * pre_tol) << "post[" << t << ", " << j << "]";
    }
    const double comb_tol = 4 * smax * m_err + 8 * static_cast<double>(p.sinkhorn_iters) * n * 0x1p-24;
    for (int64_t i = 0; i < n * n; ++i)
      EXPECT_NEAR(comb[t * n * n + i], rcomb[i], comb_tol) << "comb[" << t << "] " << i;
    for (int64_t h = 0; h < H; ++h) {
      double tol = rounding_bound(o.collapsed.view().dtype(), rcol[h]);
      for (int64_t j = 0; j < n; ++j) tol += (pre_tol + 4 * 0x1p-24) * std::abs(xt[j * H + h]);
      EXPECT_NEAR(col[t * H + h], rcol[h], tol) << "collapsed[" << t << ", " << h << "]";
    }
  }
}

struct Shape {
  int64_t T, n, H;
};

class HcPreContract : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

TEST_P(HcPreContract, matches_fp64_reference) {
  const auto [sd, cd] = GetParam();
  // Decode and batch sizes (both work splits), hidden sizes with 16-lane tails, n = 1 and n = 4.
  for (Shape sh : {Shape{1, 4, 64}, Shape{5, 4, 100}, Shape{3, 1, 37}, Shape{40, 4, 48}, Shape{70, 4, 20}}) {
    for (int64_t iters : {int64_t{20}, int64_t{1}}) {
      SCOPED_TRACE("T=" + std::to_string(sh.T) + " n=" + std::to_string(sh.n) + " H=" + std::to_string(sh.H) +
                   " iters=" + std::to_string(iters));
      Site s(sh.T, sh.n, sh.H, sd, 1);
      PreOut o(sh.T, sh.n, sh.H, cd);
      const HyperConnectionParams p{1e-6f, 1e-6f, iters};
      const auto before = s.streams.bytes();
      ASSERT_TRUE(run_pre(s, p, o).ok());
      EXPECT_EQ(s.streams.bytes(), before) << "streams were mutated";
      check_pre_against_reference(s, p, o);
    }
  }
}

// Every output is the contract's fp32 formula bit for bit (x . x and fn . x in linear/linear's order).
TEST_P(HcPreContract, is_the_contracts_fp32_formula_bit_for_bit) {
  const auto [sd, cd] = GetParam();
  for (Shape sh : {Shape{3, 4, 100}, Shape{70, 4, 33}, Shape{2, 1, 16}}) {
    Site s(sh.T, sh.n, sh.H, sd, 2);
    PreOut o(sh.T, sh.n, sh.H, cd);
    const HyperConnectionParams p{1e-6f, 1e-6f, 7};
    ASSERT_TRUE(run_pre(s, p, o).ok());
    for (int64_t t = 0; t < sh.T; ++t) {
      const Fp32Pre want = fp32_contract(s, t, p, false);
      EXPECT_EQ(std::memcmp(o.post.view().data_as<float>() + t * sh.n, want.post.data(), sh.n * sizeof(float)), 0) << t;
      EXPECT_EQ(
          std::memcmp(o.comb.view().data_as<float>() + t * sh.n * sh.n, want.comb.data(), sh.n * sh.n * sizeof(float)),
          0)
          << t;
      const std::vector<double> got = to_doubles(o.collapsed.view().slice0(t, t + 1));
      for (int64_t h = 0; h < sh.H; ++h) {
        ASSERT_EQ(got[h], rounded(want.collapsed[h], cd)) << "token " << t << " h " << h;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(dtypes, HcPreContract,
                         ::testing::Combine(::testing::Values(DType::kBF16, DType::kF32),
                                            ::testing::Values(DType::kBF16, DType::kF32)),
                         [](const auto& info) {
                           return "streams_" + std::string(dtype_name(std::get<0>(info.param))) + "_collapsed_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// Enough Sinkhorn iterations make comb doubly stochastic: after the last column step its columns sum to 1
// (up to hc_eps over the column's sum), and the rows' distance from 1 shrinks with the iterations (random
// logits spread over +-5 here, so 20 iterations, V4's setting, leave up to ~5e-3; 200 leave < 1e-4). A
// single iteration normalizes the columns only.
TEST(HcPre, sinkhorn_makes_combs_rows_and_columns_sum_to_one) {
  Site s(16, 4, 64, DType::kBF16, 3);
  std::vector<double> worst_row;
  for (int64_t iters : {int64_t{1}, int64_t{20}, int64_t{200}}) {
    PreOut o(16, 4, 64, DType::kBF16);
    const HyperConnectionParams p{1e-6f, 1e-6f, iters};
    ASSERT_TRUE(run_pre(s, p, o).ok());
    check_pre_against_reference(s, p, o);
    const float* c = o.comb.view().data_as<float>();
    double worst = 0;
    for (int64_t t = 0; t < 16; ++t) {
      for (int64_t i = 0; i < 4; ++i) {
        double row = 0, col = 0;
        for (int64_t j = 0; j < 4; ++j) {
          row += c[t * 16 + i * 4 + j];
          col += c[t * 16 + j * 4 + i];
          EXPECT_GT(c[t * 16 + i * 4 + j], 0.0f);
        }
        EXPECT_NEAR(col, 1.0, 1e-4) << "token " << t << " column " << i << " iters " << iters;
        worst = std::max(worst, std::abs(row - 1.0));
      }
    }
    worst_row.push_back(worst);
  }
  EXPECT_GT(worst_row[0], 0.1) << "one iteration already balanced the rows; the check is too weak";
  EXPECT_LT(worst_row[1], worst_row[0] / 10);
  EXPECT_LT(worst_row[2], 1e-4);
  EXPECT_LT(worst_row[2], worst_row[1]);
  RecordProperty("worst_row_deviation_1_20_200", std::to_string(worst_row[0]) + " " + std::to_string(worst_row[1]) +
                                                     " " + std::to_string(worst_row[2]));
}

// n = 1: comb is the single value (1 + eps) / (1 + 2 eps), post 2 sigmoid(.), collapsed pre * the stream.
TEST(HcPre, one_stream) {
  Site s(4, 1, 40, DType::kF32, 4);
  PreOut o(4, 1, 40, DType::kF32);
  const HyperConnectionParams p{1e-6f, 1e-3f, 20};
  ASSERT_TRUE(run_pre(s, p, o).ok());
  check_pre_against_reference(s, p, o);
  float c = 1.0f + p.hc_eps;  // softmax of one logit is exactly 1
  c = c / (c + p.hc_eps);
  for (int64_t it = 1; it < 20; ++it) {
    c = c / (c + p.hc_eps);
    c = c / (c + p.hc_eps);
  }
  for (int64_t t = 0; t < 4; ++t) EXPECT_EQ(o.comb.view().data_as<float>()[t], c);
}

// A token's bits do not depend on the other tokens, on its position, on the thread count nor on which work
// split runs (whole token blocks for large batches, fn rows split over the threads for small ones).
TEST(HcPre, batch_invariant_and_thread_independent) {
  const int64_t T = 100, n = 4, H = 72;
  Site s(T, n, H, DType::kBF16, 5);
  const HyperConnectionParams p;
  set_num_threads(1);
  PreOut all(T, n, H, DType::kBF16);
  ASSERT_TRUE(run_pre(s, p, all).ok());
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    PreOut again(T, n, H, DType::kBF16);
    ASSERT_TRUE(run_pre(s, p, again).ok());
    EXPECT_EQ(again.collapsed.bytes(), all.collapsed.bytes()) << threads;
    EXPECT_EQ(again.post.bytes(), all.post.bytes()) << threads;
    EXPECT_EQ(again.comb.bytes(), all.comb.bytes()) << threads;
    for (int64_t t0 : {int64_t{0}, int64_t{37}, T - 8}) {
      for (int64_t m : {int64_t{1}, int64_t{8}}) {
        PreOut part(m, n, H, DType::kBF16);
        ASSERT_TRUE(ops::hc_pre(s.streams.view().slice0(t0, t0 + m), s.fn.view(), s.base.view(), s.scale.view(), p,
                                part.collapsed.view(), part.post.view(), part.comb.view())
                        .ok());
        EXPECT_EQ(std::memcmp(part.collapsed.data(), all.collapsed.view().data_as<bf16_t>() + t0 * H, m * H * 2), 0)
            << t0 << " " << m << " " << threads;
        EXPECT_EQ(std::memcmp(part.post.data(), all.post.view().data_as<float>() + t0 * n, m * n * 4), 0);
        EXPECT_EQ(std::memcmp(part.comb.data(), all.comb.view().data_as<float>() + t0 * n * n, m * n * n * 4), 0);
      }
    }
  }
  set_num_threads(0);
}

TEST(HcPre, strided_streams_and_outputs) {
  for (DType sd : {DType::kF32, DType::kBF16}) {
    const int64_t T = 5, n = 4, H = 24;
    Site s(T, n, H, sd, 6);
    const HyperConnectionParams p;
    PreOut want(T, n, H, DType::kF32);
    ASSERT_TRUE(run_pre(s, p, want).ok());
    // Streams with padded rows and a gap between tokens; outputs transposed or padded.
    const int64_t es = static_cast<int64_t>(dtype_size(sd));
    OwnedTensor wide(sd, {T, n, H + 3}, 7 * T);
    const TensorView sv = TensorView::strided(wide.data(), sd, {T, n, H}, {n * (H + 3) + 7, H + 3, 1});
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(static_cast<char*>(wide.data()) + (t * (n * (H + 3) + 7) + j * (H + 3)) * es,
                    static_cast<const char*>(s.streams.data()) + (t * n + j) * H * es, static_cast<size_t>(H * es));
    OwnedTensor col(DType::kF32, {H, T}), post(DType::kF32, {n, T}), comb(DType::kF32, {T, n, n + 1});
    const TensorView cv = TensorView::strided(col.data(), DType::kF32, {T, H}, {1, T});
    const TensorView pv = TensorView::strided(post.data(), DType::kF32, {T, n}, {1, T});
    const TensorView bv = TensorView::strided(comb.data(), DType::kF32, {T, n, n}, {n * (n + 1), 1, n + 1});
    ASSERT_TRUE(ops::hc_pre(sv, s.fn.view(), s.base.view(), s.scale.view(), p, cv, pv, bv).ok());
    EXPECT_EQ(to_doubles(cv), to_doubles(want.collapsed.view()));
    EXPECT_EQ(to_doubles(pv), to_doubles(want.post.view()));
    EXPECT_EQ(to_doubles(bv), to_doubles(want.comb.view()));
  }
}

TEST(HcPre, empty_batch) {
  Site s(0, 4, 16, DType::kBF16, 7);
  PreOut o(0, 4, 16, DType::kBF16);
  EXPECT_TRUE(run_pre(s, HyperConnectionParams{}, o).ok());
  Site h(0, 4, 16, DType::kBF16, 7, true);
  EXPECT_TRUE(ops::hc_head(h.streams.view(), h.fn.view(), h.base.view(), h.scale.view(), HyperConnectionParams{},
                           o.collapsed.view())
                  .ok());
}

TEST(HcPre, invalid_arguments) {
  const int64_t T = 2, n = 4, H = 16;
  Site s(T, n, H, DType::kBF16, 8);
  PreOut o(T, n, H, DType::kBF16);
  fill_uniform(o.collapsed.view(), 1);
  fill_uniform(o.post.view(), 2);
  fill_uniform(o.comb.view(), 3);
  const auto c0 = o.collapsed.bytes(), p0 = o.post.bytes(), b0 = o.comb.bytes();
  std::vector<float> f32(4096);
  std::vector<int64_t> i64(64);
  const TensorView sv = s.streams.view(), fv = s.fn.view(), bv = s.base.view(), scv = s.scale.view(),
                   cv = o.collapsed.view(), pv = o.post.view(), mv = o.comb.view();
  const HyperConnectionParams ok;
  auto expect_error = [&](const std::string& message, const TensorView& st, const TensorView& f, const TensorView& b,
                          const TensorView& sc, const HyperConnectionParams& p, const TensorView& c,
                          const TensorView& po, const TensorView& co) {
    const Status status = ops::hc_pre(st, f, b, sc, p, c, po, co);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_EQ(status.message(), message);
    EXPECT_TRUE(o.collapsed.bytes() == c0 && o.post.bytes() == p0 && o.comb.bytes() == b0)
        << "outputs written on error: " << message;
  };
  expect_error("hc_pre: streams has dtype fp16 but must be fp32 or bf16",
               TensorView(s.streams.data(), DType::kF16, {T, n, H}), fv, bv, scv, ok, cv, pv, mv);
  expect_error("hc_pre: streams has rank 2 but must have rank 3 ([T, n, H])",
               TensorView(s.streams.data(), DType::kBF16, {T, n * H}), fv, bv, scv, ok, cv, pv, mv);
  expect_error("hc_pre: streams has shape [2, 0, 16] but must have n >= 1 streams and H >= 1 hidden elements",
               TensorView(s.streams.data(), DType::kBF16, {T, 0, H}), fv, bv, scv, ok, cv, pv, mv);
  expect_error("hc_pre: streams has shape [2, 4, 0] but must have n >= 1 streams and H >= 1 hidden elements",
               TensorView(s.streams.data(), DType::kBF16, {T, n, 0}), fv, bv, scv, ok, cv, pv, mv);
  expect_error("hc_pre: fn has dtype bf16 but must be fp32", sv, TensorView(s.fn.data(), DType::kBF16, {24, 64}), bv,
               scv, ok, cv, pv, mv);
  expect_error("hc_pre: fn has rank 1 but must have rank 2 ([(2 + n) n, n H])", sv,
               TensorView(s.fn.data(), DType::kF32, {24 * 64}), bv, scv, ok, cv, pv, mv);
  expect_error("hc_pre: fn has shape [8, 64] but must be [24, 64] ([(2 + n) n, n H] with n, H from streams)", sv,
               TensorView(s.fn.data(), DType::kF32, {8, 64}), bv, scv, ok, cv, pv, mv);
  expect_error("hc_pre: fn has stride 2 along its last dimension but must have unit stride there (contiguous rows)", sv,
               TensorView::strided(f32.data(), DType::kF32, {24, 64}, {128, 2}), bv, scv, ok, cv, pv, mv);
  expect_error("hc_pre: base has dtype bf16 but must be fp32", sv, fv, TensorView(s.base.data(), DType::kBF16, {24}),
               scv, ok, cv, pv, mv);
  expect_error("hc_pre: base has shape [23] but must be [24] ([(2 + n) n] with n from streams)", sv, fv,
               TensorView(s.base.data(), DType::kF32, {23}), scv, ok, cv, pv, mv);
  expect_error("hc_pre: scale has dtype int64 but must be fp32", sv, fv, bv, TensorView(i64.data(), DType::kI64, {3}),
               ok, cv, pv, mv);
  expect_error("hc_pre: scale has shape [1] but must be [3] ([3]: pre, post, comb)", sv, fv, bv,
               TensorView(s.scale.data(), DType::kF32, {1}), ok, cv, pv, mv);
  expect_error("hc_pre: params.norm_eps is -1e-06 but must be finite and >= 0", sv, fv, bv, scv, {-1e-6f, 1e-6f, 20},
               cv, pv, mv);
  expect_error("hc_pre: params.norm_eps is nan but must be finite and >= 0", sv, fv, bv, scv,
               {std::numeric_limits<float>::quiet_NaN(), 1e-6f, 20}, cv, pv, mv);
  expect_error("hc_pre: params.hc_eps is inf but must be finite and >= 0", sv, fv, bv, scv,
               {1e-6f, std::numeric_limits<float>::infinity(), 20}, cv, pv, mv);
  expect_error("hc_pre: params.sinkhorn_iters is 0 but must be >= 1", sv, fv, bv, scv, {1e-6f, 1e-6f, 0}, cv, pv, mv);
  expect_error("hc_pre: collapsed has dtype fp16 but must be fp32 or bf16", sv, fv, bv, scv, ok,
               TensorView(o.collapsed.data(), DType::kF16, {T, H}), pv, mv);
  expect_error("hc_pre: collapsed has shape [2, 17] but must be [2, 16] ([T, H] from streams)", sv, fv, bv, scv, ok,
               TensorView(f32.data(), DType::kBF16, {T, H + 1}), pv, mv);
  expect_error("hc_pre: post has dtype bf16 but must be fp32", sv, fv, bv, scv, ok, cv,
               TensorView(o.post.data(), DType::kBF16, {T, n}), mv);
  expect_error("hc_pre: post has shape [2, 3] but must be [2, 4] ([T, n] from streams)", sv, fv, bv, scv, ok, cv,
               TensorView(o.post.data(), DType::kF32, {T, 3}), mv);
  expect_error("hc_pre: comb has dtype bf16 but must be fp32", sv, fv, bv, scv, ok, cv, pv,
               TensorView(o.comb.data(), DType::kBF16, {T, n, n}));
  expect_error("hc_pre: comb has shape [2, 16] but must be [2, 4, 4] ([T, n, n] from streams)", sv, fv, bv, scv, ok, cv,
               pv, TensorView(o.comb.data(), DType::kF32, {T, n * n}));
  expect_error("hc_pre: collapsed overlaps streams in memory; outputs must not alias inputs", sv, fv, bv, scv, ok,
               TensorView(s.streams.data(), DType::kBF16, {T, H}), pv, mv);
  expect_error("hc_pre: post overlaps fn in memory; outputs must not alias inputs", sv, fv, bv, scv, ok, cv,
               TensorView(s.fn.data(), DType::kF32, {T, n}), mv);
  expect_error("hc_pre: comb overlaps scale in memory; outputs must not alias inputs", sv, fv, bv, scv, ok, cv, pv,
               TensorView::strided(s.scale.data(), DType::kF32, {T, n, n}, {0, 0, 0}));
  expect_error("hc_pre: comb overlaps post in memory; outputs must not alias inputs", sv, fv, bv, scv, ok, cv, pv,
               TensorView(o.post.data(), DType::kF32, {T, n, n}));
}

// ---- hc_head ----

TEST(HcHead, matches_fp64_reference_and_the_fp32_formula) {
  for (DType sd : {DType::kBF16, DType::kF32}) {
    for (Shape sh : {Shape{1, 4, 64}, Shape{9, 4, 100}, Shape{70, 4, 20}, Shape{3, 1, 17}}) {
      SCOPED_TRACE("T=" + std::to_string(sh.T) + " n=" + std::to_string(sh.n) + " H=" + std::to_string(sh.H));
      Site s(sh.T, sh.n, sh.H, sd, 9, true);
      OwnedTensor col(sd, {sh.T, sh.H});
      const HyperConnectionParams p{1e-6f, 1e-6f, 20};
      ASSERT_TRUE(ops::hc_head(s.streams.view(), s.fn.view(), s.base.view(), s.scale.view(), p, col.view()).ok());
      const std::vector<double> x = to_doubles(s.streams.view()), fn = to_doubles(s.fn.view()),
                                base = to_doubles(s.base.view()), scale = to_doubles(s.scale.view()),
                                got = to_doubles(col.view());
      const int64_t K = sh.n * sh.H;
      for (int64_t t = 0; t < sh.T; ++t) {
        std::vector<double> pre, rcol;
        ref::hc_head_token(x.data() + t * K, sh.n, sh.H, fn.data(), base.data(), scale.data(), p.norm_eps, p.hc_eps,
                           pre, rcol);
        const Fp32Pre want = fp32_contract(s, t, p, true);
        for (int64_t h = 0; h < sh.H; ++h) {
          ASSERT_EQ(got[t * sh.H + h], rounded(want.collapsed[h], sd)) << "token " << t << " h " << h;
          double tol = rounding_bound(sd, rcol[h]);
          for (int64_t j = 0; j < sh.n; ++j) tol += 1e-5 * std::abs(x[t * K + j * sh.H + h]);
          EXPECT_NEAR(got[t * sh.H + h], rcol[h], tol) << "token " << t << " h " << h;
        }
      }
    }
  }
}

TEST(HcHead, invalid_arguments) {
  Site s(2, 4, 16, DType::kBF16, 10, true);
  OwnedTensor col(DType::kBF16, {2, 16});
  const HyperConnectionParams ok;
  auto message = [&](const TensorView& fn, const TensorView& base, const TensorView& scale,
                     const HyperConnectionParams& p,
                     const TensorView& c) { return ops::hc_head(s.streams.view(), fn, base, scale, p, c).message(); };
  EXPECT_EQ(message(TensorView(s.fn.data(), DType::kF32, {24, 64}), s.base.view(), s.scale.view(), ok, col.view()),
            "hc_head: fn has shape [24, 64] but must be [4, 64] ([n, n H] with n, H from streams)");
  EXPECT_EQ(message(s.fn.view(), TensorView(s.base.data(), DType::kF32, {3}), s.scale.view(), ok, col.view()),
            "hc_head: base has shape [3] but must be [4] ([n] with n from streams)");
  EXPECT_EQ(message(s.fn.view(), s.base.view(), TensorView(s.fn.data(), DType::kF32, {3}), ok, col.view()),
            "hc_head: scale has shape [3] but must be [1] ([1])");
  EXPECT_EQ(message(s.fn.view(), s.base.view(), s.scale.view(), {-1.0f, 1e-6f, 20}, col.view()),
            "hc_head: params.norm_eps is -1 but must be finite and >= 0");
  EXPECT_EQ(message(s.fn.view(), s.base.view(), s.scale.view(), ok, TensorView(col.data(), DType::kBF16, {2, 15})),
            "hc_head: collapsed has shape [2, 15] but must be [2, 16] ([T, H] from streams)");
  EXPECT_EQ(message(s.fn.view(), s.base.view(), s.scale.view(), ok, TensorView(s.fn.data(), DType::kF32, {2, 16})),
            "hc_head: collapsed overlaps fn in memory; outputs must not alias inputs");
  // sinkhorn_iters is not hc_head's.
  EXPECT_TRUE(
      ops::hc_head(s.streams.view(), s.fn.view(), s.base.view(), s.scale.view(), {1e-6f, 1e-6f, 0}, col.view()).ok());
}

// ---- hc_post ----

struct PostInputs {
  int64_t T, n, H;
  OwnedTensor y, post, comb, streams;
  PostInputs(int64_t T_, int64_t n_, int64_t H_, DType yd, DType sd, uint64_t seed)
      : T(T_),
        n(n_),
        H(H_),
        y(yd, {T_, H_}),
        post(DType::kF32, {T_, n_}),
        comb(DType::kF32, {T_, n_, n_}),
        streams(sd, {T_, n_, H_}) {
    fill_uniform(y.view(), seed, -3.f, 3.f);
    fill_uniform(post.view(), seed + 1, 0.f, 2.f);
    fill_uniform(comb.view(), seed + 2, 0.f, 0.6f);
    fill_uniform(streams.view(), seed + 3, -3.f, 3.f);
  }
};

TEST(HcPost, matches_fp64_reference_and_the_fp32_formula) {
  for (DType yd : {DType::kBF16, DType::kF32}) {
    for (DType sd : {DType::kBF16, DType::kF32}) {
      for (Shape sh : {Shape{1, 4, 64}, Shape{7, 4, 100}, Shape{3, 1, 37}}) {
        SCOPED_TRACE("y " + std::string(dtype_name(yd)) + " streams " + std::string(dtype_name(sd)) +
                     " T=" + std::to_string(sh.T) + " H=" + std::to_string(sh.H));
        PostInputs in(sh.T, sh.n, sh.H, yd, sd, 11);
        OwnedTensor out(sd, {sh.T, sh.n, sh.H});
        const auto before = in.streams.bytes();
        ASSERT_TRUE(ops::hc_post(in.y.view(), in.post.view(), in.comb.view(), in.streams.view(), out.view()).ok());
        EXPECT_EQ(in.streams.bytes(), before);
        const std::vector<double> y = to_doubles(in.y.view()), po = to_doubles(in.post.view()),
                                  co = to_doubles(in.comb.view()), x = to_doubles(in.streams.view()),
                                  got = to_doubles(out.view());
        const int64_t n = sh.n, H = sh.H;
        for (int64_t t = 0; t < sh.T; ++t) {
          std::vector<double> want;
          ref::hc_post_token(y.data() + t * H, po.data() + t * n, co.data() + t * n * n, x.data() + t * n * H, n, H,
                             want);
          for (int64_t k = 0; k < n; ++k) {
            for (int64_t h = 0; h < H; ++h) {
              // The contract in fp32: the post term, then j in order with fused multiply-adds.
              float acc = static_cast<float>(po[t * n + k]) * static_cast<float>(y[t * H + h]);
              double abs_sum = std::abs(po[t * n + k] * y[t * H + h]);
              for (int64_t j = 0; j < n; ++j) {
                acc = std::fma(static_cast<float>(co[t * n * n + j * n + k]),
                               static_cast<float>(x[(t * n + j) * H + h]), acc);
                abs_sum += std::abs(co[t * n * n + j * n + k] * x[(t * n + j) * H + h]);
              }
              const double g = got[(t * n + k) * H + h];
              ASSERT_EQ(g, rounded(acc, sd)) << t << " " << k << " " << h;
              EXPECT_NEAR(g, want[k * H + h], (n + 1) * 0x1p-24 * abs_sum + rounding_bound(sd, want[k * H + h]));
            }
          }
        }
      }
    }
  }
}

// In place (out is streams) gives the out-of-place bits, whatever the thread count.
TEST(HcPost, in_place_equals_out_of_place) {
  for (DType sd : {DType::kBF16, DType::kF32}) {
    PostInputs in(37, 4, 80, DType::kBF16, sd, 12);
    OwnedTensor out(sd, {37, 4, 80});
    ASSERT_TRUE(ops::hc_post(in.y.view(), in.post.view(), in.comb.view(), in.streams.view(), out.view()).ok());
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      PostInputs again(37, 4, 80, DType::kBF16, sd, 12);
      ASSERT_TRUE(
          ops::hc_post(again.y.view(), again.post.view(), again.comb.view(), again.streams.view(), again.streams.view())
              .ok());
      EXPECT_EQ(std::memcmp(again.streams.data(), out.data(), static_cast<size_t>(37 * 4 * 80) * dtype_size(sd)), 0)
          << threads;
    }
    set_num_threads(0);
  }
}

TEST(HcPost, strided_and_batch_invariant) {
  const int64_t T = 6, n = 4, H = 40;
  PostInputs in(T, n, H, DType::kF32, DType::kF32, 13);
  OwnedTensor want(DType::kF32, {T, n, H});
  ASSERT_TRUE(ops::hc_post(in.y.view(), in.post.view(), in.comb.view(), in.streams.view(), want.view()).ok());
  // comb transposed in memory, post and out with padding; one token alone.
  OwnedTensor comb_t(DType::kF32, {T, n, n}), post_p(DType::kF32, {T, n + 2}), out_p(DType::kF32, {T, n, H + 5});
  const TensorView cv = TensorView::strided(comb_t.data(), DType::kF32, {T, n, n}, {n * n, 1, n});
  const TensorView pv = TensorView::strided(post_p.data(), DType::kF32, {T, n}, {n + 2, 1});
  const TensorView ov = TensorView::strided(out_p.data(), DType::kF32, {T, n, H}, {n * (H + 5), H + 5, 1});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n; ++j) {
      pv.data_as<float>()[t * (n + 2) + j] = in.post.view().data_as<float>()[t * n + j];
      for (int64_t k = 0; k < n; ++k)
        cv.data_as<float>()[t * n * n + k * n + j] = in.comb.view().data_as<float>()[t * n * n + j * n + k];
    }
  ASSERT_TRUE(ops::hc_post(in.y.view(), pv, cv, in.streams.view(), ov).ok());
  EXPECT_EQ(to_doubles(ov), to_doubles(want.view()));
  OwnedTensor one(DType::kF32, {1, n, H});
  ASSERT_TRUE(ops::hc_post(in.y.view().slice0(3, 4), in.post.view().slice0(3, 4), in.comb.view().slice0(3, 4),
                           in.streams.view().slice0(3, 4), one.view())
                  .ok());
  EXPECT_EQ(std::memcmp(one.data(), want.view().data_as<float>() + 3 * n * H, n * H * sizeof(float)), 0);
}

TEST(HcPost, empty_batch_and_invalid_arguments) {
  PostInputs e(0, 4, 16, DType::kBF16, DType::kBF16, 14);
  OwnedTensor eo(DType::kBF16, {0, 4, 16});
  EXPECT_TRUE(ops::hc_post(e.y.view(), e.post.view(), e.comb.view(), e.streams.view(), eo.view()).ok());

  const int64_t T = 2, n = 4, H = 16;
  PostInputs in(T, n, H, DType::kBF16, DType::kBF16, 15);
  OwnedTensor out(DType::kBF16, {T, n, H});
  fill_uniform(out.view(), 16);
  const auto before = out.bytes();
  const TensorView y = in.y.view(), po = in.post.view(), co = in.comb.view(), st = in.streams.view(), o = out.view();
  auto expect_error = [&](const std::string& message, const TensorView& a, const TensorView& b, const TensorView& c,
                          const TensorView& d, const TensorView& e2) {
    const Status status = ops::hc_post(a, b, c, d, e2);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_EQ(status.message(), message);
    EXPECT_EQ(out.bytes(), before) << "out written on error: " << message;
  };
  expect_error("hc_post: streams has rank 2 but must have rank 3 ([T, n, H])", y, po, co,
               TensorView(in.streams.data(), DType::kBF16, {T, n * H}), o);
  expect_error("hc_post: streams has shape [2, 0, 16] but must have n >= 1 streams", y, po, co,
               TensorView(in.streams.data(), DType::kBF16, {T, 0, H}), o);
  expect_error("hc_post: y has dtype fp16 but must be fp32 or bf16", TensorView(in.y.data(), DType::kF16, {T, H}), po,
               co, st, o);
  expect_error("hc_post: y has shape [2, 15] but must be [2, 16] ([T, H] from streams)",
               TensorView(in.y.data(), DType::kBF16, {T, H - 1}), po, co, st, o);
  expect_error("hc_post: post has dtype bf16 but must be fp32", y, TensorView(in.post.data(), DType::kBF16, {T, n}), co,
               st, o);
  expect_error("hc_post: post has shape [1, 4] but must be [2, 4] ([T, n] from streams)", y,
               TensorView(in.post.data(), DType::kF32, {1, n}), co, st, o);
  expect_error("hc_post: comb has shape [2, 4, 3] but must be [2, 4, 4] ([T, n, n] from streams)", y, po,
               TensorView(in.comb.data(), DType::kF32, {T, n, 3}), st, o);
  expect_error("hc_post: out has dtype fp16 but must be fp32 or bf16", y, po, co, st,
               TensorView(out.data(), DType::kF16, {T, n, H}));
  expect_error("hc_post: out has shape [2, 4, 15] but must be [2, 4, 16] (streams' shape [T, n, H])", y, po, co, st,
               TensorView(out.data(), DType::kBF16, {T, n, H - 1}));
  // out may be streams itself, but not a shifted or differently strided view of it.
  expect_error("hc_post: out overlaps streams in memory; outputs must not alias inputs", y, po, co, st,
               TensorView(in.streams.view().data_as<bf16_t>() + 1, DType::kBF16, {T, n, H}));
  expect_error("hc_post: out overlaps streams in memory; outputs must not alias inputs", y, po, co, st,
               TensorView::strided(in.streams.data(), DType::kBF16, {T, n, H}, {H, n * H / 2, 1}));
  expect_error("hc_post: out overlaps y in memory; outputs must not alias inputs", y, po, co, st,
               TensorView(in.y.data(), DType::kBF16, {T, n, H}));
  // An out inside comb's bytes only (H = 8: 2 x 4 x 8 bf16 = comb's 2 x 4 x 4 fp32), so that no other input's
  // allocation can lie in its span whatever the heap's layout.
  PostInputs narrow(T, n, 8, DType::kBF16, DType::kBF16, 17);
  const Status status = ops::hc_post(narrow.y.view(), narrow.post.view(), narrow.comb.view(), narrow.streams.view(),
                                     TensorView(narrow.comb.data(), DType::kBF16, {T, n, 8}));
  EXPECT_EQ(status.message(), "hc_post: out overlaps comb in memory; outputs must not alias inputs");
}

}  // namespace
}  // namespace genbridge::testing
