// Contract test for quant/mx_dequant; runs unchanged in every target build. On Ascend950 every q code
// and scale byte is decoded and compared bit for bit with the fp64 reference rounded to y's dtype; on
// Ascend910 the exact Unimplemented message is checked.
#include "genbridge/ops/quant/mx_dequant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "genbridge/core/threading.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "ops/common/quant/quant_ref.h"
#include "quant_test_util.h"

namespace genbridge::testing {
namespace {

bool same_bits_or_both_nan(double want, double got) {
  if (std::isnan(want)) return std::isnan(got);
  return want == got && std::signbit(want) == std::signbit(got);
}

std::vector<int64_t> q_shape(std::vector<int64_t> y, DType qd) {
  if (qd == DType::kFp4E2M1x2) y.back() /= 2;
  return y;
}

std::vector<int64_t> scale_shape(const std::vector<int64_t>& y, int64_t block) {
  std::vector<int64_t> s(y.begin(), y.end() - 1);
  s.push_back(ops::mx_scale_pairs(y.back(), block));
  s.push_back(2);
  return s;
}

// Runs the op and compares y with the reference (fp32 product, rounded to y's dtype) element by element.
void run_and_check(const TensorView& q, const TensorView& scale, int64_t block, const TensorView& y) {
  const auto q_copy = logical_bytes(q), s_copy = logical_bytes(scale);
  const Status st = ops::mx_dequant(q, scale, block, y);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(logical_bytes(q), q_copy) << "q was mutated";
  EXPECT_EQ(logical_bytes(scale), s_copy) << "scale was mutated";
  const int64_t k = y.dim(-1), rows = y.numel() / std::max<int64_t>(k, 1);
  std::vector<double> want;
  ref::mx_dequant(q_copy, s_copy, rows, k, block, q.dtype(), want);
  const std::vector<double> got = to_doubles(y);
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = std::isnan(want[i]) ? want[i] : round_like(static_cast<float>(want[i]), y.dtype());
    if (!same_bits_or_both_nan(w, got[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << "elements differing from the reference; first at " << first << ": got "
                    << (first >= 0 ? got[first] : 0.0) << ", want " << (first >= 0 ? want[first] : 0.0);
}

class MxDequantContract : public ::testing::TestWithParam<std::tuple<DType, DType>> {};

// Random bytes cover every code of q (NaN and infinity codes included) and every scale byte (0xFF included).
TEST_P(MxDequantContract, every_code_and_scale_matches_reference) {
  GB_REQUIRE_MX();
  const auto [qd, yd] = GetParam();
  uint64_t seed = 3;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{3, 100}, {2, 3, 256}, {64, 64}, {1, 4096}}) {
    for (int64_t block : {32, 64, 1024}) {
      SCOPED_TRACE(shape_name(shape) + " block " + std::to_string(block));
      OwnedTensor q(qd, q_shape(shape, qd)), s(DType::kE8M0, scale_shape(shape, block)), y(yd, shape);
      fill_bytes(q.view(), seed++);
      fill_bytes(s.view(), seed++);
      run_and_check(q.view(), s.view(), block, y.view());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(dtypes, MxDequantContract,
                         ::testing::Combine(::testing::Values(DType::kFp8E4M3FN, DType::kFp8E5M2, DType::kFp4E2M1x2),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_to_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(MxDequant, inverts_dynamic_mx_quant_on_unsaturated_elements) {
  GB_REQUIRE_MX();
  for (DType qd : {DType::kFp8E4M3FN, DType::kFp8E5M2, DType::kFp4E2M1x2}) {
    SCOPED_TRACE(std::string(dtype_name(qd)));
    const std::vector<int64_t> shape{4, 200};
    ops::MxQuantConfig c;
    c.dst = qd;
    OwnedTensor x(DType::kBF16, shape), q(qd, q_shape(shape, qd)), s(DType::kE8M0, scale_shape(shape, 32)),
        y(DType::kF32, shape);
    set_values(x.view(), wide_range_values(800, 32, 5, DType::kBF16));
    ASSERT_TRUE(ops::dynamic_mx_quant(x.view(), c, q.view(), s.view()).ok());
    run_and_check(q.view(), s.view(), 32, y.view());
    const std::vector<double> xv = to_doubles(x.view()), yv = to_doubles(y.view());
    const std::vector<uint8_t> sb = logical_bytes(s.view());
    const int m = qd == DType::kFp8E4M3FN ? 3 : (qd == DType::kFp8E5M2 ? 2 : 1);
    const int emin = qd == DType::kFp8E4M3FN ? -6 : (qd == DType::kFp8E5M2 ? -14 : 0);
    int64_t unsaturated = 0, far = 0;
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t i = 0; i < 200; ++i) {
        const double scale = std::ldexp(1.0, sb[r * 8 + i / 32] - 127), xi = xv[r * 200 + i];
        if (std::abs(xi) / scale > ref::mx_max(qd)) continue;
        ++unsaturated;
        const double bound = std::max(std::abs(xi) * std::ldexp(1.0, -(m + 1)), std::ldexp(scale, emin - m - 1));
        far += std::abs(yv[r * 200 + i] - xi) > bound;
      }
    }
    EXPECT_GT(unsaturated, 0);
    EXPECT_EQ(far, 0);
  }
}

TEST(MxDequant, padding_scale_slot_is_ignored) {
  GB_REQUIRE_MX();
  OwnedTensor q(DType::kFp8E4M3FN, {2, 96}), s(DType::kE8M0, {2, 2, 2}), y1(DType::kF32, {2, 96}), y2(DType::kF32, {2, 96});
  fill_bytes(q.view(), 1);
  for (int i = 0; i < 8; ++i) s.view().data_as<uint8_t>()[i] = static_cast<uint8_t>(120 + i);
  s.view().data_as<uint8_t>()[3] = 0;
  s.view().data_as<uint8_t>()[7] = 0;
  ASSERT_TRUE(ops::mx_dequant(q.view(), s.view(), 32, y1.view()).ok());
  s.view().data_as<uint8_t>()[3] = 0xff;
  s.view().data_as<uint8_t>()[7] = 0x42;
  ASSERT_TRUE(ops::mx_dequant(q.view(), s.view(), 32, y2.view()).ok());
  EXPECT_EQ(y1.bytes(), y2.bytes());
}

TEST(MxDequant, strided_inputs_and_output) {
  GB_REQUIRE_MX();
  for (DType qd : {DType::kFp8E4M3FN, DType::kFp4E2M1x2}) {
    const std::vector<int64_t> shape{2, 3, 160};
    OwnedTensor qs(qd, {2 * 2 * 3 * 160 + 64}), ss(DType::kE8M0, {160}), ys(DType::kBF16, {2 * 2 * 3 * 160 + 64});
    const TensorView q = column_strided(qs, qd, q_shape(shape, qd));
    const TensorView s = TensorView::strided(ss.data(), DType::kE8M0, {2, 3, 2, 2}, {3 * 16, 16, 5, 2});
    const TensorView y = column_strided(ys, DType::kBF16, shape);
    fill_bytes(q, 7);
    fill_bytes(s, 8);
    run_and_check(q, s, 64, y);
  }
}

TEST(MxDequant, empty_inputs) {
  GB_REQUIRE_MX();
  OwnedTensor q(DType::kFp8E4M3FN, {0, 64}), s(DType::kE8M0, {0, 1, 2}), y(DType::kF32, {0, 64});
  EXPECT_TRUE(ops::mx_dequant(q.view(), s.view(), 32, y.view()).ok());
  OwnedTensor q2(DType::kFp8E4M3FN, {2, 0}), s2(DType::kE8M0, {2, 0, 2}), y2(DType::kF32, {2, 0});
  EXPECT_TRUE(ops::mx_dequant(q2.view(), s2.view(), 32, y2.view()).ok());
}

std::vector<std::byte> run_bits(int threads) {
  set_num_threads(threads);
  OwnedTensor q(DType::kFp8E4M3FN, {37, 2048}), s(DType::kE8M0, {37, 32, 2}), y(DType::kBF16, {37, 2048});
  fill_bytes(q.view(), 1);
  fill_bytes(s.view(), 2);
  EXPECT_TRUE(ops::mx_dequant(q.view(), s.view(), 32, y.view()).ok());
  set_num_threads(0);
  return y.bytes();
}

TEST(MxDequant, bit_identical_across_thread_counts) {
  GB_REQUIRE_MX();
  const auto one = run_bits(1);
  EXPECT_EQ(one, run_bits(2));
  EXPECT_EQ(one, run_bits(3));
}

TEST(MxDequant, invalid_arguments) {
  GB_REQUIRE_MX();
  const std::string op = "mx_dequant";
  OwnedTensor qs(DType::kFp8E4M3FN, {2, 64}), ss(DType::kE8M0, {2, 1, 2}), ys(DType::kBF16, {2, 64});
  fill_bytes(qs.view(), 1);
  fill_bytes(ss.view(), 2);
  fill_uniform(ys.view(), 3);
  const TensorView q = qs.view(), s = ss.view(), y = ys.view();
  auto expect = [&](const std::string& message, TensorView qv, TensorView sv, int64_t block, TensorView yv) {
    const auto y_before = ys.bytes();
    const Status st = ops::mx_dequant(qv, sv, block, yv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(ys.bytes(), y_before) << "y written on error: " << message;
  };
  expect(op + ": q has dtype int8 but must be fp8_e4m3fn, fp8_e5m2 or fp4_e2m1x2", TensorView(qs.data(), DType::kI8, {2, 64}),
         s, 32, y);
  expect(op + ": q has rank 0 but must have rank >= 1 (the op works along the last dimension)",
         TensorView(qs.data(), DType::kFp8E4M3FN, {}), s, 32, y);
  expect(op + ": block_size is 40 but must be a multiple of 32 in [32, 1024]", q, s, 40, y);
  expect(op + ": y has dtype int8 but must be fp32, fp16 or bf16", q, s, 32, TensorView(ys.data(), DType::kI8, {2, 64}));
  expect(op + ": y has shape [2, 32] but must be [2, 64] (q's shape)", q, s, 32, TensorView(ys.data(), DType::kBF16, {2, 32}));
  expect(op + ": y has shape [2, 64] but must be [2, 128] (q's shape with the last dimension doubled: two fp4 values per "
              "byte)",
         TensorView(qs.data(), DType::kFp4E2M1x2, {2, 64}), TensorView(ss.data(), DType::kE8M0, {2, 2, 2}), 32, y);
  expect(op + ": scale has dtype fp8_e4m3fn but must be e8m0", q, TensorView(ss.data(), DType::kFp8E4M3FN, {2, 1, 2}), 32, y);
  expect(op + ": scale has shape [2, 2] but must be [2, 1, 2] (q's leading shape + [ceil(ceil(K / block_size) / 2), 2] "
              "for K = 64, block_size = 32)",
         q, TensorView(ss.data(), DType::kE8M0, {2, 2}), 32, y);
  expect(op + ": scale has shape [2, 0, 2] but must be [2, 1, 2] (q's leading shape + [ceil(ceil(K / block_size) / 2), "
              "2] for K = 64, block_size = 32)",
         q, TensorView(ss.data(), DType::kE8M0, {2, 0, 2}), 32, y);
  expect(op + ": scale has a null data pointer but 4 elements", q, TensorView(nullptr, DType::kE8M0, {2, 1, 2}), 32, y);
}

TEST(MxDequant, unsupported_provider) {
  OwnedTensor q(DType::kFp8E4M3FN, {2, 64}), s(DType::kE8M0, {2, 1, 2}), y(DType::kF32, {2, 64});
  fill_bytes(q.view(), 1);
  fill_bytes(s.view(), 2);
  std::memset(y.data(), 0xaa, y.bytes().size());
  const auto y_before = y.bytes();
  const Status st = ops::mx_dequant(q.view(), s.view(), 32, y.view());
  if (ops::build_target() == "Ascend910") {
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_EQ(st.message(),
              "mx_dequant is not supported on Ascend910 (A2/A3): the generation has no FP8/FP4/E8M0 data path; "
              "MX dequantization is an Ascend950 capability");
    EXPECT_EQ(y.bytes(), y_before);
  } else {
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

}  // namespace
}  // namespace genbridge::testing
