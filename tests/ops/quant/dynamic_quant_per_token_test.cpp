// Contract test for quant/dynamic_quant_per_token; runs unchanged in every target build. q and scale are
// compared bit for bit with the fp64 reference (ops/common/quant/quant_ref.h).
#include "genbridge/ops/quant/dynamic_quant_per_token.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "ops/common/quant/quant_ref.h"
#include "quant_test_util.h"

namespace genbridge::testing {
namespace {

constexpr float kEps = ops::kDynamicQuantPerTokenDefaultEps;

std::vector<int64_t> scale_shape_of(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin(), shape.end() - 1);
}

struct PerTokenRun {
  std::vector<int8_t> q;
  std::vector<float> scale;
};

// Runs the op on x (values in logical order), checks it against the reference bit for bit, checks that
// x is unmutated and that q * scale reconstructs x to within half a step (plus the fp32 quotient's
// rounding). Returns the outputs in logical order.
PerTokenRun run_and_check(const TensorView& x, OwnedTensor& x_storage, const TensorView& q, const TensorView& scale) {
  const std::vector<int64_t> shape(x.shape(), x.shape() + x.rank());
  const int64_t k = shape.back(), rows = leading_rows(shape);
  const auto x_before = x_storage.bytes();
  const Status st = ops::dynamic_quant_per_token(x, kEps, q, scale);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(x_storage.bytes(), x_before) << "x was mutated";

  const std::vector<double> xv = to_doubles(x);
  std::vector<int8_t> want_q;
  std::vector<float> want_s;
  ref::dynamic_quant_per_token(xv, rows, k, kEps, want_q, want_s);

  PerTokenRun got;
  const std::vector<uint8_t> qb = logical_bytes(q);
  got.q.assign(qb.begin(), qb.end());
  got.scale.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) got.scale[r] = scale.data_as<const float>()[logical_offset(scale, r)];
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(std::bit_cast<uint32_t>(got.scale[r]), std::bit_cast<uint32_t>(want_s[r]))
        << "scale of row " << r << ": " << got.scale[r] << " vs " << want_s[r];
  }
  int64_t bad = 0;
  for (size_t i = 0; i < want_q.size(); ++i) bad += got.q[i] != want_q[i];
  EXPECT_EQ(bad, 0) << "q elements differing from the reference";
  int64_t far = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double s = got.scale[r];
    if (!std::isfinite(s)) continue;
    for (int64_t c = 0; c < k; ++c) far += std::abs(got.q[r * k + c] * s - xv[r * k + c]) > s * (0.5 + std::ldexp(1.0, -16));
  }
  EXPECT_EQ(far, 0) << "elements whose q * scale is more than half a step from x";
  return got;
}

class PerTokenContract : public ::testing::TestWithParam<std::tuple<DType, std::vector<int64_t>>> {};

TEST_P(PerTokenContract, matches_fp64_reference) {
  const auto [d, shape] = GetParam();
  OwnedTensor xs(d, shape), q(DType::kI8, shape), s(DType::kF32, scale_shape_of(shape));
  const int64_t n = xs.view().numel();
  set_values(xs.view(), wide_range_values(n, std::max<int64_t>(1, shape.back()), 7, d));
  run_and_check(xs.view(), xs, q.view(), s.view());
}

INSTANTIATE_TEST_SUITE_P(shapes, PerTokenContract,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(std::vector<int64_t>{3, 256},
                                                              std::vector<int64_t>{2, 3, 2048},
                                                              std::vector<int64_t>{1, 5120},
                                                              std::vector<int64_t>{7, 33},
                                                              std::vector<int64_t>{4096})),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_" +
                                  shape_name(std::get<1>(info.param));
                         });

TEST(DynamicQuantPerToken, all_zero_row_gives_zero_q_and_finite_scale) {
  OwnedTensor x(DType::kBF16, {3, 64}), q(DType::kI8, {3, 64}), s(DType::kF32, {3});
  fill_uniform(x.view(), 3);
  for (int c = 0; c < 64; ++c) x.view().data_as<bf16_t>()[64 + c] = float_to_bf16(c % 2 ? -0.f : 0.f);
  std::memset(q.data(), 0x55, 3 * 64);
  const auto got = run_and_check(x.view(), x, q.view(), s.view());
  EXPECT_EQ(got.scale[1], kEps / 127.f);
  EXPECT_TRUE(std::isfinite(got.scale[1]));
  for (int c = 0; c < 64; ++c) EXPECT_EQ(got.q[64 + c], 0);
}

TEST(DynamicQuantPerToken, rounds_half_to_even) {
  // amax 127 gives scale exactly 1, so x / scale = x and the halves are exact ties.
  OwnedTensor x(DType::kF32, {1, 8}), q(DType::kI8, {1, 8}), s(DType::kF32, {1});
  const std::vector<float> v{127.f, 2.5f, 3.5f, -2.5f, -3.5f, 0.5f, -0.5f, 126.5f};
  set_values(x.view(), v);
  const auto got = run_and_check(x.view(), x, q.view(), s.view());
  EXPECT_EQ(got.scale[0], 1.0f);
  const std::vector<int8_t> want{127, 2, 4, -2, -4, 0, 0, 126};
  EXPECT_EQ(got.q, want);
}

// The contract divides by the scale in fp32. Multiplying by a rounded reciprocal instead differs only
// where the quotient lands next to a half; this row is made of such inputs, found by search.
TEST(DynamicQuantPerToken, quotient_is_the_fp32_division_not_a_reciprocal_product) {
  const float amax = 100.f;
  const float s = amax / 127.f, r = 1.0f / s;
  std::vector<float> row{amax};
  for (int k = 0; k < 127 && row.size() < 64; ++k) {
    float x = (static_cast<float>(k) + 0.5f) * s;
    for (int i = 0; i < 6; ++i) x = std::nextafter(x, 0.f);
    for (int i = 0; i < 12; ++i, x = std::nextafter(x, 1e9f)) {
      if (float_to_int8(x / s) != float_to_int8(x * r)) row.push_back(x);
    }
  }
  ASSERT_GE(row.size(), 2u) << "no input separates division from the reciprocal product";
  // 200 elements: whole 64-element groups (the kernel's vector path) and a tail.
  for (size_t i = 1; row.size() < 200; ++i) row.push_back(row[i]);
  const int64_t k = static_cast<int64_t>(row.size());
  OwnedTensor x(DType::kF32, {1, k}), q(DType::kI8, {1, k}), sc(DType::kF32, {1});
  set_values(x.view(), row);
  const auto got = run_and_check(x.view(), x, q.view(), sc.view());
  EXPECT_EQ(got.scale[0], s);
  for (int64_t i = 1; i < k; ++i) EXPECT_EQ(got.q[i], float_to_int8(row[i] / s)) << row[i];
}

TEST(DynamicQuantPerToken, non_finite_rows_get_non_finite_scale_and_zero_q) {
  OwnedTensor x(DType::kF32, {3, 40}), q(DType::kI8, {3, 40}), s(DType::kF32, {3});
  fill_uniform(x.view(), 5);
  x.view().data_as<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  x.view().data_as<float>()[40 + 17] = -INFINITY;
  const auto got = run_and_check(x.view(), x, q.view(), s.view());
  EXPECT_TRUE(std::isnan(got.scale[0]));
  EXPECT_EQ(got.scale[1], INFINITY);
  EXPECT_TRUE(std::isfinite(got.scale[2]));
  for (int c = 0; c < 80; ++c) EXPECT_EQ(got.q[c], 0) << c;
}

TEST(DynamicQuantPerToken, strided_input_and_outputs) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::vector<int64_t> shape{2, 3, 300};
    OwnedTensor xs(d, {2 * 2 * 3 * 300 + 64}), qs(DType::kI8, {2 * 2 * 3 * 300 + 64}), ss(DType::kF32, {64});
    const TensorView x = column_strided(xs, d, shape);
    const TensorView q = column_strided(qs, DType::kI8, shape);
    const TensorView s = TensorView::strided(ss.data(), DType::kF32, {2, 3}, {9, 3});
    set_values(x, wide_range_values(x.numel(), 300, 11, d));
    run_and_check(x, xs, q, s);
  }
}

TEST(DynamicQuantPerToken, hidden_not_multiple_of_16) {
  for (int64_t k : {1, 15, 17, 4099}) {
    OwnedTensor x(DType::kBF16, {3, k}), q(DType::kI8, {3, k}), s(DType::kF32, {3});
    set_values(x.view(), wide_range_values(3 * k, k, 13, DType::kBF16));
    run_and_check(x.view(), x, q.view(), s.view());
  }
}

TEST(DynamicQuantPerToken, empty_inputs) {
  {
    OwnedTensor x(DType::kBF16, {0, 128}), q(DType::kI8, {0, 128}), s(DType::kF32, {0});
    EXPECT_TRUE(ops::dynamic_quant_per_token(x.view(), kEps, q.view(), s.view()).ok());
  }
  {
    // Rows without elements have amax 0: their scale is eps / 127.
    OwnedTensor x(DType::kBF16, {3, 0}), q(DType::kI8, {3, 0}), s(DType::kF32, {3});
    ASSERT_TRUE(ops::dynamic_quant_per_token(x.view(), kEps, q.view(), s.view()).ok());
    for (int r = 0; r < 3; ++r) EXPECT_EQ(s.view().data_as<float>()[r], kEps / 127.f);
  }
}

std::vector<std::byte> run_bits(int threads) {
  set_num_threads(threads);
  OwnedTensor x(DType::kBF16, {37, 2048}), q(DType::kI8, {37, 2048}), s(DType::kF32, {37});
  set_values(x.view(), wide_range_values(37 * 2048, 2048, 17, DType::kBF16));
  EXPECT_TRUE(ops::dynamic_quant_per_token(x.view(), kEps, q.view(), s.view()).ok());
  set_num_threads(0);
  std::vector<std::byte> out = q.bytes();
  out.insert(out.end(), s.bytes().begin(), s.bytes().end());
  return out;
}

TEST(DynamicQuantPerToken, bit_identical_across_thread_counts) {
  const auto one = run_bits(1);
  EXPECT_EQ(one, run_bits(2));
  EXPECT_EQ(one, run_bits(3));
}

TEST(DynamicQuantPerToken, invalid_arguments) {
  const std::string op = "dynamic_quant_per_token";
  OwnedTensor xs(DType::kBF16, {2, 64}), qs(DType::kI8, {2, 64}), ss(DType::kF32, {2});
  fill_uniform(xs.view(), 1);
  fill_bytes(qs.view(), 2);
  fill_uniform(ss.view(), 3);
  const TensorView x = xs.view(), q = qs.view(), s = ss.view();
  auto expect = [&](const std::string& message, TensorView xv, TensorView qv, TensorView sv, float eps = kEps) {
    const auto q_before = qs.bytes(), s_before = ss.bytes();
    const Status st = ops::dynamic_quant_per_token(xv, eps, qv, sv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(qs.bytes(), q_before) << "q written on error: " << message;
    EXPECT_EQ(ss.bytes(), s_before) << "scale written on error: " << message;
  };
  std::vector<int8_t> i8(128);
  expect(op + ": x has dtype int8 but must be fp32, fp16 or bf16", TensorView(i8.data(), DType::kI8, {2, 64}), q, s);
  expect(op + ": x has rank 0 but must have rank >= 1 (the op works along the last dimension)",
         TensorView(xs.data(), DType::kBF16, {}), q, s);
  expect(op + ": eps is nan but must be finite and > 0", x, q, s, NAN);
  expect(op + ": eps is inf but must be finite and > 0", x, q, s, INFINITY);
  expect(op + ": eps is 0 but must be finite and > 0", x, q, s, 0.f);
  expect(op + ": eps is -1 but must be finite and > 0", x, q, s, -1.f);
  expect(op + ": q has dtype fp8_e4m3fn but must be int8", x, TensorView(qs.data(), DType::kFp8E4M3FN, {2, 64}), s);
  expect(op + ": q has shape [2, 63] but must be [2, 64] (x's shape)", x, TensorView(qs.data(), DType::kI8, {2, 63}), s);
  expect(op + ": scale has dtype fp16 but must be fp32", x, q, TensorView(ss.data(), DType::kF16, {2}));
  expect(op + ": scale has shape [2, 1] but must be [2] (x's shape without its last dimension)", x, q,
         TensorView(ss.data(), DType::kF32, {2, 1}));
  expect(op + ": scale has shape [1] but must be [2] (x's shape without its last dimension)", x, q,
         TensorView(ss.data(), DType::kF32, {1}));
  expect(op + ": x has a null data pointer but 128 elements", TensorView(nullptr, DType::kBF16, {2, 64}), q, s);
  expect(op + ": q has a null data pointer but 128 elements", x, TensorView(nullptr, DType::kI8, {2, 64}), s);
}

}  // namespace
}  // namespace genbridge::testing
