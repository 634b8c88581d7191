#pragma once
// Shared contract harness for the norm/* operators: runs an op on seeded inputs and checks it against
// the fp64 oracle, that inputs are unmutated, and (add_* ops) that residual_sum is the fp32 sum
// rounded to the input dtype, bit for bit. The same file runs unchanged in every target build.

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "genbridge/ops/norm/add_gemma_rms_norm.h"
#include "genbridge/ops/norm/add_rms_norm.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "ops/common/norm/norm_ref.h"
#include "support/tensor_util.h"

namespace genbridge::testing {

enum class NormKind { kRms, kGemma, kAddRms, kAddGemma };
// kRowPadded: rows are padded (fast path); kColumnStrided: every other element (generic path).
enum class Layout { kContiguous, kRowPadded, kColumnStrided };

inline bool is_add(NormKind k) { return k == NormKind::kAddRms || k == NormKind::kAddGemma; }
inline bool is_gemma(NormKind k) { return k == NormKind::kGemma || k == NormKind::kAddGemma; }

// Calls the op; `out2` is rstd for the plain ops and residual_sum for the add_* ops.
inline Status call_norm(NormKind k, const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                        const TensorView& y, const TensorView& out2) {
  switch (k) {
    case NormKind::kRms: return ops::rms_norm(x, w, eps, y, out2);
    case NormKind::kGemma: return ops::gemma_rms_norm(x, w, eps, y, out2);
    case NormKind::kAddRms: return ops::add_rms_norm(x, w, residual, eps, y, out2);
    case NormKind::kAddGemma: return ops::add_gemma_rms_norm(x, w, residual, eps, y, out2);
  }
  return internal_error("unreachable");
}

inline double tolerance(NormKind k, DType d) {
  if (d == DType::kF32) return 1e-5;
  return is_add(k) ? 1e-2 : 2e-2;
}

inline float round_like(float v, DType d) {
  if (d == DType::kF16) return fp16_to_float(float_to_fp16(v));
  if (d == DType::kBF16) return bf16_to_float(float_to_bf16(v));
  return v;
}

// A view of `shape` over `t`'s storage with the requested layout (storage must be large enough).
inline TensorView make_layout(OwnedTensor& t, DType d, const std::vector<int64_t>& shape, Layout layout) {
  TensorView v(t.data(), d, shape.data(), static_cast<int>(shape.size()));
  if (layout == Layout::kContiguous || shape.empty()) return v;
  std::vector<int64_t> strides(shape.size());
  const int64_t cols = shape.back();
  int64_t s = layout == Layout::kRowPadded ? cols + 16 : 2 * cols;
  strides.back() = layout == Layout::kRowPadded ? 1 : 2;
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  // Rebuild through the strided factory for ranks 1..3 used by the tests.
  switch (shape.size()) {
    case 1: return TensorView::strided(t.data(), d, {shape[0]}, {strides[0]});
    case 2: return TensorView::strided(t.data(), d, {shape[0], shape[1]}, {strides[0], strides[1]});
    default:
      return TensorView::strided(t.data(), d, {shape[0], shape[1], shape[2]}, {strides[0], strides[1], strides[2]});
  }
}

inline int64_t storage_elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return 2 * n + 16 * (n / std::max<int64_t>(1, shape.back()) + 1) + 64;
}

struct NormRun {
  int64_t checked = 0;
  int64_t violations = 0;
  double worst = 0.0;
};

// Runs the op on seeded data and checks every contract property; returns the comparison stats.
inline NormRun run_and_check(NormKind k, DType d, const std::vector<int64_t>& shape, Layout layout = Layout::kContiguous,
                             uint64_t seed = 1) {
  const int64_t cols = shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  OwnedTensor xs(d, {storage_elements(shape)}), rs(d, {storage_elements(shape)}), ys(d, {storage_elements(shape)}),
      sums(d, {storage_elements(shape)}), ws(d, {cols});
  std::vector<int64_t> rstd_shape = shape;
  rstd_shape.back() = 1;
  OwnedTensor rstd(DType::kF32, rstd_shape);
  const TensorView x = make_layout(xs, d, shape, layout);
  const TensorView res = make_layout(rs, d, shape, layout);
  const TensorView y = make_layout(ys, d, shape, layout);
  const TensorView sum = make_layout(sums, d, shape, layout);
  const TensorView w = ws.view();
  fill_uniform(x, seed, -3.f, 3.f);
  fill_uniform(res, seed + 1, -3.f, 3.f);
  if (is_gemma(k)) {
    fill_uniform(w, seed + 2, -0.5f, 0.5f);
  } else {
    fill_uniform(w, seed + 2, 0.5f, 1.5f);
  }
  const auto x_before = xs.bytes(), r_before = rs.bytes(), w_before = ws.bytes();

  const float eps = 1e-6f;
  const Status st = call_norm(k, x, w, res, eps, y, is_add(k) ? sum : rstd.view());
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(xs.bytes(), x_before) << "x was mutated";
  EXPECT_EQ(ws.bytes(), w_before) << "weight was mutated";
  EXPECT_EQ(rs.bytes(), r_before) << "residual was mutated";

  std::vector<double> in = to_doubles(x);
  if (is_add(k)) {
    const std::vector<double> rv = to_doubles(res), got_sum = to_doubles(sum);
    for (size_t i = 0; i < in.size(); ++i) {
      const float want = round_like(static_cast<float>(in[i]) + static_cast<float>(rv[i]), d);
      EXPECT_EQ(static_cast<float>(got_sum[i]), want) << "residual_sum element " << i;
      in[i] = want;
    }
  }
  std::vector<double> w_eff = to_doubles(w);
  if (is_gemma(k)) {
    for (double& v : w_eff) v += 1.0;
  }
  std::vector<double> ref_y, ref_rstd;
  ref::rms_norm(in, w_eff, rows, eps, ref_y, ref_rstd);

  NormRun run;
  const double tol = tolerance(k, d);
  const std::vector<double> got = to_doubles(y);
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - ref_y[i]);
    run.worst = std::max(run.worst, err / (tol + tol * std::abs(ref_y[i])));
    if (err > tol + tol * std::abs(ref_y[i])) ++run.violations;
    ++run.checked;
  }
  if (!is_add(k)) {
    const std::vector<double> got_rstd = to_doubles(rstd.view());
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_NEAR(got_rstd[r], ref_rstd[r], 1e-5 * ref_rstd[r]) << "rstd row " << r;
    }
  }
  EXPECT_EQ(run.violations, 0) << "worst error / tolerance = " << run.worst;
  return run;
}

// ---- invalid arguments: every check with its exact message, and nothing written on error ----

struct BadCallFixture {
  NormKind kind;
  DType d = DType::kBF16;
  OwnedTensor x{DType::kBF16, {2, 4096}}, w{DType::kBF16, {4096}}, res{DType::kBF16, {2, 4096}},
      y{DType::kBF16, {2, 4096}}, sum{DType::kBF16, {2, 4096}}, rstd{DType::kF32, {2, 1}};
  explicit BadCallFixture(NormKind k) : kind(k) {}
  TensorView out2() { return is_add(kind) ? sum.view() : rstd.view(); }
  // Calls with the given replacements, checks the status, and that y and out2 were not written.
  void expect_error(const std::string& message, TensorView xv, TensorView wv, TensorView rv, TensorView yv,
                    TensorView o2, float eps = 1e-6f) {
    const auto y_before = y.bytes(), s_before = sum.bytes(), r_before = rstd.bytes();
    const Status st = call_norm(kind, xv, wv, rv, eps, yv, o2);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(y.bytes(), y_before) << "y written on error";
    EXPECT_EQ(sum.bytes(), s_before) << "residual_sum written on error";
    EXPECT_EQ(rstd.bytes(), r_before) << "rstd written on error";
  }
};

inline void check_invalid_arguments(NormKind k, const std::string& op, const std::string& wname) {
  BadCallFixture f(k);
  fill_uniform(f.x.view(), 3);
  fill_uniform(f.y.view(), 4);
  const TensorView x = f.x.view(), w = f.w.view(), r = f.res.view(), y = f.y.view(), o2 = f.out2();
  std::vector<int8_t> i8(2 * 4096);
  f.expect_error(op + ": x has dtype int8 but must be fp32, fp16 or bf16",
                 TensorView(i8.data(), DType::kI8, {2, 4096}), w, r, y, o2);
  f.expect_error(op + ": " + wname + " has shape [4095] but must match x's trailing shape [4096]",
                 x, TensorView(f.w.data(), DType::kBF16, {4095}), r, y, o2);
  f.expect_error(op + ": " + wname + " has dtype fp16 but must have x's dtype bf16",
                 x, TensorView(f.w.data(), DType::kF16, {4096}), r, y, o2);
  f.expect_error(op + ": " + wname + " has rank 3 but must have rank 1..2 (x's rank)",
                 x, TensorView(f.w.data(), DType::kBF16, {1, 1, 4096}), r, y, o2);
  f.expect_error(op + ": y has shape [2, 4095] but must have x's shape [2, 4096]",
                 x, w, r, TensorView(f.y.data(), DType::kBF16, {2, 4095}), o2);
  f.expect_error(op + ": y has dtype fp32 but must have x's dtype bf16",
                 x, w, r, TensorView(f.y.data(), DType::kF32, {2, 4096}), o2);
  f.expect_error(op + ": eps is nan but must be finite and >= 0", x, w, r, y, o2, NAN);
  f.expect_error(op + ": eps is -1 but must be finite and >= 0", x, w, r, y, o2, -1.f);
  f.expect_error(op + ": x has a null data pointer but 8192 elements",
                 TensorView(nullptr, DType::kBF16, {2, 4096}), w, r, y, o2);
  {
    OwnedTensor x0(DType::kBF16, {2, 0}), w0(DType::kBF16, {0});
    f.expect_error(op + ": " + wname + " has 0 elements; the normalised dimensions must be non-empty",
                   x0.view(), w0.view(), r, y, o2);
  }
  if (is_add(k)) {
    f.expect_error(op + ": residual has shape [1, 4096] but must have x's shape [2, 4096]",
                   x, w, TensorView(f.res.data(), DType::kBF16, {1, 4096}), y, o2);
    f.expect_error(op + ": residual_sum has dtype fp16 but must have x's dtype bf16",
                   x, w, r, y, TensorView(f.sum.data(), DType::kF16, {2, 4096}));
  } else {
    f.expect_error(op + ": rstd has dtype bf16 but must be fp32", x, w, r, y,
                   TensorView(f.rstd.data(), DType::kBF16, {2, 1}));
    f.expect_error(op + ": rstd has shape [2] but must be [2, 1] (x's leading shape with the normalised "
                   "dimensions set to 1)", x, w, r, y, TensorView(f.rstd.data(), DType::kF32, {2}));
  }
}

// The shapes every norm contract test covers (the last dimension is normalised).
inline std::vector<std::vector<int64_t>> contract_shapes() {
  return {{3, 256}, {2, 3, 2048}, {2, 4096}, {1, 5120}, {0, 5120}, {7, 33}};
}

}  // namespace genbridge::testing

namespace genbridge::testing {

inline std::string shape_name(const std::vector<int64_t>& s) {
  std::string n;
  for (int64_t d : s) n += (n.empty() ? "" : "x") + std::to_string(d);
  return n;
}

// Output bits of one run (y then out2) with the given thread count, for determinism checks.
inline std::vector<std::byte> run_bits(NormKind k, DType d, int threads) {
  set_num_threads(threads);
  OwnedTensor x(d, {37, 2048}), w(d, {2048}), r(d, {37, 2048}), y(d, {37, 2048}), s(d, {37, 2048}),
      rstd(DType::kF32, {37, 1});
  fill_uniform(x.view(), 11);
  fill_uniform(w.view(), 12, -0.5f, 0.5f);
  fill_uniform(r.view(), 13);
  const Status st = call_norm(k, x.view(), w.view(), r.view(), 1e-6f, y.view(), is_add(k) ? s.view() : rstd.view());
  EXPECT_TRUE(st.ok()) << st.to_string();
  set_num_threads(0);
  std::vector<std::byte> out = y.bytes();
  const auto& o2 = is_add(k) ? s.bytes() : rstd.bytes();
  out.insert(out.end(), o2.begin(), o2.end());
  return out;
}

}  // namespace genbridge::testing

// The contract tests every norm op shares. Suite: test-suite prefix; kind: NormKind; op/wname: names
// as they appear in messages.
#define GB_NORM_CONTRACT_TESTS(Suite, kind, op, wname)                                                        \
  class Suite##Contract                                                                                       \
      : public ::testing::TestWithParam<std::tuple<::genbridge::DType, std::vector<int64_t>>> {};             \
  TEST_P(Suite##Contract, matches_fp64_reference) {                                                          \
    ::genbridge::testing::run_and_check(kind, std::get<0>(GetParam()), std::get<1>(GetParam()));             \
  }                                                                                                           \
  INSTANTIATE_TEST_SUITE_P(                                                                                   \
      shapes, Suite##Contract,                                                                                \
      ::testing::Combine(::testing::Values(::genbridge::DType::kF32, ::genbridge::DType::kF16,                \
                                           ::genbridge::DType::kBF16),                                        \
                         ::testing::ValuesIn(::genbridge::testing::contract_shapes())),                       \
      [](const auto& info) {                                                                                  \
        return std::string(::genbridge::dtype_name(std::get<0>(info.param))) + "_" +                          \
               ::genbridge::testing::shape_name(std::get<1>(info.param));                                     \
      });                                                                                                     \
  TEST(Suite, strided_input_row_padded) {                                                                     \
    for (auto d : {::genbridge::DType::kF32, ::genbridge::DType::kBF16, ::genbridge::DType::kF16})            \
      ::genbridge::testing::run_and_check(kind, d, {3, 1000}, ::genbridge::testing::Layout::kRowPadded);     \
  }                                                                                                           \
  TEST(Suite, strided_input_column_strided) {                                                                 \
    for (auto d : {::genbridge::DType::kF32, ::genbridge::DType::kBF16, ::genbridge::DType::kF16})            \
      ::genbridge::testing::run_and_check(kind, d, {2, 3, 300}, ::genbridge::testing::Layout::kColumnStrided); \
  }                                                                                                           \
  TEST(Suite, hidden_not_multiple_of_16) {                                                                    \
    ::genbridge::testing::run_and_check(kind, ::genbridge::DType::kBF16, {5, 4099});                          \
    ::genbridge::testing::run_and_check(kind, ::genbridge::DType::kF16, {1, 1});                              \
  }                                                                                                           \
  TEST(Suite, bit_identical_across_thread_counts) {                                                           \
    for (auto d : {::genbridge::DType::kBF16, ::genbridge::DType::kF16}) {                                    \
      const auto one = ::genbridge::testing::run_bits(kind, d, 1);                                            \
      EXPECT_EQ(one, ::genbridge::testing::run_bits(kind, d, 2));                                             \
      EXPECT_EQ(one, ::genbridge::testing::run_bits(kind, d, 3));                                             \
      EXPECT_EQ(one, ::genbridge::testing::run_bits(kind, d, 1));                                             \
    }                                                                                                         \
  }                                                                                                           \
  TEST(Suite, invalid_arguments) { ::genbridge::testing::check_invalid_arguments(kind, op, wname); }
