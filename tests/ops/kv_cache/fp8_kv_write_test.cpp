// Contract test for kv_cache/fp8_kv_write; runs unchanged in every target build. On Ascend910 the
// provider is the explicit unsupported one, asserted with its exact message.
#include "kv_write_harness.h"

namespace genbridge::testing {
namespace {

GB_KV_WRITE_CONTRACT_TESTS(Fp8KvWrite, KvCacheFormat::kFp8Fp32PackedScale)

TEST(Fp8KvWrite, explicit_unsupported_provider_on_ascend910) {
  OwnedTensor k(DType::kBF16, {1, 2, 64}), v(DType::kBF16, {1, 2, 64}), kc(DType::kU8, {2, 2, 16, 68}),
      vc(DType::kU8, {2, 2, 16, 68});
  std::vector<int32_t> slots = {3};
  const auto before = kc.bytes();
  const Status st =
      ops::fp8_kv_write(k.view(), v.view(), TensorView(slots.data(), DType::kI32, {1}), kc.view(), vc.view());
  if (fp8_supported()) {
    EXPECT_TRUE(st.ok()) << st.to_string();
    return;
  }
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(st.message(),
            "fp8_kv_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its quantized KV cache is int8 "
            "with fp16 scales, written by int8_kv_write)");
  EXPECT_EQ(kc.bytes(), before);
}

// All-zero row: zero codes and the smallest positive fp32 scale; the row maximum maps to +-448; values
// far below the scale's range land on e4m3fn subnormals or zero, never NaN.
TEST(Fp8KvWrite, zero_row_saturation_point_and_subnormals) {
  if (!fp8_supported()) return;  // the unsupported provider is asserted above
  TestCache cache(KvCacheFormat::kFp8Fp32PackedScale, 1, 1, 16, 32);
  OwnedTensor k(DType::kF32, {2, 1, 32}), v(DType::kF32, {2, 1, 32});
  float* kp = k.view().data_as<float>();
  kp[32] = -448.f * 3.f;  // amax 1344: scale 3
  for (int i = 1; i < 32; ++i) kp[32 + i] = 3.f * std::ldexp(1.f, -i);  // down into the subnormals
  ASSERT_TRUE(cache.write(k.view(), v.view(), {0, 1}).ok());
  EXPECT_EQ(cache.stored_scale(true, 0, 0), 0x1p-149);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(cache.stored_code(true, 0, 0, c), 0.0);
  EXPECT_EQ(cache.stored_scale(true, 1, 0), 3.0);
  EXPECT_EQ(cache.stored_code(true, 1, 0, 0), -448.0);
  for (int i = 1; i < 32; ++i) {
    const double code = cache.stored_code(true, 1, 0, i);
    EXPECT_FALSE(std::isnan(code));
    EXPECT_EQ(code, i <= 9 ? std::ldexp(1.0, -i) : 0.0) << "element " << i;  // 2^-10: tie to even 0
  }
}

TEST(Fp8KvWrite, invalid_arguments) {
  if (!fp8_supported()) return;  // the unsupported provider answers Unimplemented to every call
  OwnedTensor k(DType::kBF16, {4, 2, 64}), v(DType::kBF16, {4, 2, 64}), kc(DType::kU8, {4, 2, 16, 68}),
      vc(DType::kU8, {4, 2, 16, 68});
  std::vector<int32_t> slots = {0, 1, 2, 3};
  auto expect = [&](const std::string& msg, const TensorView& s, const TensorView& kcv, const TensorView& vcv) {
    const auto kb = kc.bytes(), vb = vc.bytes();
    const Status st = ops::fp8_kv_write(k.view(), v.view(), s, kcv, vcv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), msg);
    EXPECT_EQ(kc.bytes(), kb);
    EXPECT_EQ(vc.bytes(), vb);
  };
  const TensorView sm(slots.data(), DType::kI32, {4});
  ASSERT_TRUE(ops::fp8_kv_write(k.view(), v.view(), sm, kc.view(), vc.view()).ok());
  expect("fp8_kv_write: key_cache has dtype fp8_e4m3fn but the fp8_e4m3fn+packed fp32 scale KV cache stores uint8", sm,
         TensorView(kc.data(), DType::kFp8E4M3FN, {4, 2, 16, 68}), vc.view());
  expect("fp8_kv_write: key_cache has shape [4, 2, 16, 4]; num_kv_heads, block_size and head_dim must be >= 1", sm,
         TensorView(kc.data(), DType::kU8, {4, 2, 16, 4}), vc.view());
  expect("fp8_kv_write: key has shape [4, 2, 64] but the cache holds 2 kv heads of head_dim 60", sm,
         TensorView(kc.data(), DType::kU8, {4, 2, 16, 64}), TensorView(vc.data(), DType::kU8, {4, 2, 16, 64}));
  std::vector<int32_t> pairs = {0, 0, 0, 1, 0, 2, 0, 3};
  expect("fp8_kv_write: slot_mapping has shape [4, 2] but must be [num_tokens] (flat slots) with num_tokens = 4",
         TensorView(pairs.data(), DType::kI32, {4, 2}), kc.view(), vc.view());
  slots = {0, 1, 2, 64};
  expect("fp8_kv_write: slot_mapping[3] = 64 is outside the cache's 64 slots (num_blocks * block_size)", sm, kc.view(),
         vc.view());
}

}  // namespace
}  // namespace genbridge::testing
