// Contract test for kv_cache/int8_kv_write; runs unchanged in every target build.
#include "kv_write_harness.h"

namespace genbridge::testing {
namespace {

GB_KV_WRITE_CONTRACT_TESTS(Int8KvWrite, KvCacheFormat::kInt8Fp16Scale)

// An all-zero row stores zero codes and the smallest positive fp16 scale (finite, never 0); a row whose
// amax sits below the clamp gets the same scale; the largest element maps to +-127.
TEST(Int8KvWrite, zero_tiny_and_full_range_rows) {
  TestCache cache(KvCacheFormat::kInt8Fp16Scale, 1, 1, 16, 32);
  OwnedTensor k(DType::kF32, {3, 1, 32}), v(DType::kF32, {3, 1, 32});
  float* kp = k.view().data_as<float>();
  for (int i = 0; i < 32; ++i) kp[32 + i] = 1e-9f * static_cast<float>(i);  // tiny row
  for (int i = 0; i < 32; ++i) kp[64 + i] = static_cast<float>(i - 16) / 4.f;  // amax 4 at i = 0
  ASSERT_TRUE(cache.write(k.view(), v.view(), {0, 1, 2}).ok());
  for (int64_t slot : {0, 1}) {
    EXPECT_EQ(cache.stored_scale(true, slot, 0), 0x1p-24);
  }
  for (int c = 0; c < 32; ++c) EXPECT_EQ(cache.stored_code(true, 0, 0, c), 0.0);
  EXPECT_EQ(cache.stored_code(true, 2, 0, 0), -127.0);
  EXPECT_EQ(cache.stored_scale(true, 2, 0), static_cast<double>(fp16_to_float(float_to_fp16(4.f / 127.f))));
}

struct BadInt8 {
  OwnedTensor k{DType::kBF16, {4, 2, 64}}, v{DType::kBF16, {4, 2, 64}};
  OwnedTensor kc{DType::kI8, {4, 2, 16, 64}}, vc{DType::kI8, {4, 2, 16, 64}};
  OwnedTensor ks{DType::kF16, {4, 2, 16}}, vs{DType::kF16, {4, 2, 16}};
  std::vector<int32_t> slots = {0, 0, 0, 1, 3, 15, 2, 2};
  TensorView sm() { return TensorView(slots.data(), DType::kI32, {4, 2}); }
  void expect(const std::string& msg, const TensorView& s, const TensorView& kcv, const TensorView& ksv,
              const TensorView& vsv) {
    std::vector<std::byte> before = kc.bytes();
    for (auto* t : {&vc, &ks, &vs}) before.insert(before.end(), t->bytes().begin(), t->bytes().end());
    const Status st = ops::int8_kv_write(k.view(), v.view(), s, kcv, vc.view(), ksv, vsv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), msg);
    std::vector<std::byte> after = kc.bytes();
    for (auto* t : {&vc, &ks, &vs}) after.insert(after.end(), t->bytes().begin(), t->bytes().end());
    EXPECT_EQ(after, before) << "cache written on error";
  }
};

TEST(Int8KvWrite, invalid_arguments) {
  BadInt8 b;
  fill_uniform(b.k.view(), 1);
  ASSERT_TRUE(ops::int8_kv_write(b.k.view(), b.v.view(), b.sm(), b.kc.view(), b.vc.view(), b.ks.view(), b.vs.view())
                  .ok());
  const TensorView kc = b.kc.view(), ks = b.ks.view(), vs = b.vs.view();
  b.expect("int8_kv_write: key_cache has dtype uint8 but the int8+fp16 scale KV cache stores int8", b.sm(),
           TensorView(b.kc.data(), DType::kU8, {4, 2, 16, 64}), ks, vs);
  b.expect("int8_kv_write: key_scale_cache has dtype bf16 but the int8 KV cache keeps its scales in fp16", b.sm(), kc,
           TensorView(b.ks.data(), DType::kBF16, {4, 2, 16}), vs);
  b.expect("int8_kv_write: key_scale_cache has shape [4, 32] but must be [num_blocks, num_kv_heads, block_size] = "
           "[4, 2, 16]",
           b.sm(), kc, TensorView(b.ks.data(), DType::kF16, {4, 32}), vs);
  b.expect("int8_kv_write: value_scale_cache has shape [3, 2, 16] but must be [num_blocks, num_kv_heads, block_size] "
           "= [4, 2, 16]",
           b.sm(), kc, ks, TensorView(b.vs.data(), DType::kF16, {3, 2, 16}));
  b.expect("int8_kv_write: value_scale_cache has a null data pointer but 128 elements", b.sm(), kc, ks,
           TensorView(nullptr, DType::kF16, {4, 2, 16}));
  b.expect("int8_kv_write: slot_mapping has shape [4] but must be [num_tokens, 2] ([block, offset] pairs) with "
           "num_tokens = 4",
           TensorView(b.slots.data(), DType::kI32, {4}), kc, ks, vs);
  b.expect("int8_kv_write: slot_mapping has shape [4, 1] but must be [num_tokens, 2] ([block, offset] pairs) with "
           "num_tokens = 4",
           TensorView(b.slots.data(), DType::kI32, {4, 1}), kc, ks, vs);
  b.slots = {0, 0, 0, 1, 3, 15, 2, -2};
  b.expect("int8_kv_write: slot_mapping[3] = [2, -2] is outside the cache: block must be in [0, 4) and offset in "
           "[0, 16)",
           b.sm(), kc, ks, vs);
}

}  // namespace
}  // namespace genbridge::testing
