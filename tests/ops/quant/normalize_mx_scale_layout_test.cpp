// Contract test for quant/normalize_mx_scale_layout; runs unchanged in every target build.
#include "genbridge/ops/quant/normalize_mx_scale_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "quant_test_util.h"

namespace genbridge::testing {
namespace {

// out[m, j, t] = scale[m, 2j + t], 0 past N: checked on every byte, with out pre-filled with 0xAA.
void run_and_check(const TensorView& scale, const TensorView& out) {
  const auto in = logical_bytes(scale);
  const Status st = ops::normalize_mx_scale_layout(scale, out);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(logical_bytes(scale), in) << "scale was mutated";
  const int64_t m = scale.dim(0), n = scale.dim(1), pairs = (n + 1) / 2;
  const auto got = logical_bytes(out);
  ASSERT_EQ(static_cast<int64_t>(got.size()), m * pairs * 2);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < 2 * pairs; ++j) {
      const uint8_t want = j < n ? in[r * n + j] : 0;
      ASSERT_EQ(got[r * pairs * 2 + j], want) << "row " << r << " slot " << j;
    }
  }
}

TEST(NormalizeMxScaleLayout, even_and_odd_block_counts) {
  GB_REQUIRE_MX();
  for (int64_t n : {1, 2, 7, 64, 129, 256}) {
    SCOPED_TRACE("N = " + std::to_string(n));
    OwnedTensor s(DType::kE8M0, {5, n}), o(DType::kE8M0, {5, (n + 1) / 2, 2});
    fill_bytes(s.view(), static_cast<uint64_t>(n));
    std::memset(o.data(), 0xaa, o.bytes().size());
    run_and_check(s.view(), o.view());
  }
}

TEST(NormalizeMxScaleLayout, k_over_32_to_k_over_64_pairs) {
  GB_REQUIRE_MX();
  // K = 4096 with 32-element blocks: [M, 128] -> [M, 64, 2], element for element.
  OwnedTensor s(DType::kE8M0, {3, 128}), o(DType::kE8M0, {3, 64, 2});
  fill_bytes(s.view(), 1);
  ASSERT_TRUE(ops::normalize_mx_scale_layout(s.view(), o.view()).ok());
  EXPECT_EQ(std::memcmp(s.data(), o.data(), 3 * 128), 0);
}

TEST(NormalizeMxScaleLayout, strided_input_and_output) {
  GB_REQUIRE_MX();
  OwnedTensor ss(DType::kE8M0, {512}), os(DType::kE8M0, {512});
  const TensorView s = TensorView::strided(ss.data(), DType::kE8M0, {4, 9}, {1, 4});  // transposed storage
  const TensorView o = TensorView::strided(os.data(), DType::kE8M0, {4, 5, 2}, {32, 6, 3});
  fill_bytes(s, 3);
  run_and_check(s, o);
}

TEST(NormalizeMxScaleLayout, empty_inputs) {
  GB_REQUIRE_MX();
  OwnedTensor s(DType::kE8M0, {0, 8}), o(DType::kE8M0, {0, 4, 2});
  EXPECT_TRUE(ops::normalize_mx_scale_layout(s.view(), o.view()).ok());
  OwnedTensor s2(DType::kE8M0, {3, 0}), o2(DType::kE8M0, {3, 0, 2});
  EXPECT_TRUE(ops::normalize_mx_scale_layout(s2.view(), o2.view()).ok());
}

TEST(NormalizeMxScaleLayout, invalid_arguments) {
  GB_REQUIRE_MX();
  const std::string op = "normalize_mx_scale_layout";
  OwnedTensor ss(DType::kE8M0, {4, 7}), os(DType::kE8M0, {4, 4, 2});
  fill_bytes(ss.view(), 1);
  fill_bytes(os.view(), 2);
  const TensorView s = ss.view(), o = os.view();
  auto expect = [&](const std::string& message, TensorView sv, TensorView ov) {
    const auto before = os.bytes();
    const Status st = ops::normalize_mx_scale_layout(sv, ov);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), message);
    EXPECT_EQ(os.bytes(), before) << "out written on error: " << message;
  };
  expect(op + ": scale has dtype uint8 but must be e8m0", TensorView(ss.data(), DType::kU8, {4, 7}), o);
  expect(op + ": scale has rank 3 but must have rank 2 ([M, N], one byte per 32-element block)",
         TensorView(ss.data(), DType::kE8M0, {1, 4, 7}), o);
  expect(op + ": out has dtype uint8 but must be e8m0", s, TensorView(os.data(), DType::kU8, {4, 4, 2}));
  expect(op + ": out has shape [4, 3, 2] but must be [4, 4, 2] ([M, ceil(N / 2), 2] for scale [M, N] = [4, 7])", s,
         TensorView(os.data(), DType::kE8M0, {4, 3, 2}));
  expect(op + ": out has shape [4, 8] but must be [4, 4, 2] ([M, ceil(N / 2), 2] for scale [M, N] = [4, 7])", s,
         TensorView(os.data(), DType::kE8M0, {4, 8}));
  expect(op + ": scale has a null data pointer but 28 elements", TensorView(nullptr, DType::kE8M0, {4, 7}), o);
}

TEST(NormalizeMxScaleLayout, unsupported_provider) {
  OwnedTensor s(DType::kE8M0, {2, 3}), o(DType::kE8M0, {2, 2, 2});
  fill_bytes(s.view(), 1);
  std::memset(o.data(), 0xaa, o.bytes().size());
  const auto before = o.bytes();
  const Status st = ops::normalize_mx_scale_layout(s.view(), o.view());
  if (ops::build_target() == "Ascend910") {
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
    EXPECT_EQ(st.message(),
              "normalize_mx_scale_layout is not supported on Ascend910 (A2/A3): the generation has no MX scale layout; "
              "MX scales are an Ascend950 capability");
    EXPECT_EQ(o.bytes(), before);
  } else {
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

}  // namespace
}  // namespace genbridge::testing
