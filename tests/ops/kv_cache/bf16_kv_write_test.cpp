// Contract test for kv_cache/bf16_kv_write; runs unchanged in every target build.
#include "kv_write_harness.h"

namespace genbridge::testing {
namespace {

GB_KV_WRITE_CONTRACT_TESTS(Bf16KvWrite, KvCacheFormat::kBf16)

// Both slot-mapping shapes address the same rows.
TEST(Bf16KvWrite, flat_and_pair_slot_mappings_agree) {
  TestCache a(KvCacheFormat::kBf16, 4, 2, 16, 64), b(KvCacheFormat::kBf16, 4, 2, 16, 64);
  OwnedTensor k(DType::kF32, {5, 2, 64}), v(DType::kF32, {5, 2, 64});
  fill_uniform(k.view(), 1);
  fill_uniform(v.view(), 2);
  const std::vector<int32_t> slots = {0, 17, 63, 31, 32};
  ASSERT_TRUE(a.write(k.view(), v.view(), slots, /*pairs=*/false).ok());
  ASSERT_TRUE(b.write(k.view(), v.view(), slots, /*pairs=*/true).ok());
  EXPECT_EQ(a.all_bytes(), b.all_bytes());
  EXPECT_NE(a.all_bytes(), TestCache(KvCacheFormat::kBf16, 4, 2, 16, 64).all_bytes());
}

struct BadBf16 {
  OwnedTensor k{DType::kBF16, {4, 2, 64}}, v{DType::kBF16, {4, 2, 64}};
  OwnedTensor kc{DType::kBF16, {4, 2, 16, 64}}, vc{DType::kBF16, {4, 2, 16, 64}};
  std::vector<int32_t> slots = {0, 1, 2, 3};
  TensorView sm() { return TensorView(slots.data(), DType::kI32, {4}); }
  void expect(const std::string& msg, const TensorView& kv, const TensorView& vv, const TensorView& s,
              const TensorView& kcv, const TensorView& vcv) {
    const auto kb = kc.bytes(), vb = vc.bytes();
    const Status st = ops::bf16_kv_write(kv, vv, s, kcv, vcv);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message(), msg);
    EXPECT_EQ(kc.bytes(), kb) << "key_cache written on error";
    EXPECT_EQ(vc.bytes(), vb) << "value_cache written on error";
  }
  void expect(const std::string& msg) { expect(msg, k.view(), v.view(), sm(), kc.view(), vc.view()); }
};

TEST(Bf16KvWrite, invalid_arguments) {
  BadBf16 b;
  fill_uniform(b.k.view(), 1);
  ASSERT_TRUE(ops::bf16_kv_write(b.k.view(), b.v.view(), b.sm(), b.kc.view(), b.vc.view()).ok());
  const TensorView k = b.k.view(), v = b.v.view(), kc = b.kc.view(), vc = b.vc.view();
  std::vector<int8_t> i8(4 * 2 * 64);
  b.expect("bf16_kv_write: key has dtype int8 but must be fp32, fp16 or bf16",
           TensorView(i8.data(), DType::kI8, {4, 2, 64}), v, b.sm(), kc, vc);
  b.expect("bf16_kv_write: key has shape [4, 128] but must have rank 3 [num_tokens, num_kv_heads, head_dim]",
           TensorView(b.k.data(), DType::kBF16, {4, 128}), v, b.sm(), kc, vc);
  b.expect("bf16_kv_write: key has a null data pointer but 512 elements",
           TensorView(nullptr, DType::kBF16, {4, 2, 64}), v, b.sm(), kc, vc);
  b.expect("bf16_kv_write: value has shape [3, 2, 64] but must have key's shape [4, 2, 64]", k,
           TensorView(b.v.data(), DType::kBF16, {3, 2, 64}), b.sm(), kc, vc);
  b.expect("bf16_kv_write: value has dtype fp16 but must have key's dtype bf16", k,
           TensorView(b.v.data(), DType::kF16, {4, 2, 64}), b.sm(), kc, vc);
  b.expect("bf16_kv_write: key_cache has dtype fp16 but the bf16 KV cache stores bf16", k, v, b.sm(),
           TensorView(b.kc.data(), DType::kF16, {4, 2, 16, 64}), vc);
  b.expect("bf16_kv_write: key_cache has shape [4, 32, 64] but must have rank 4 [num_blocks, num_kv_heads, "
           "block_size, head_dim]",
           k, v, b.sm(), TensorView(b.kc.data(), DType::kBF16, {4, 32, 64}), vc);
  b.expect("bf16_kv_write: value_cache has dtype fp32 but must have key_cache's dtype bf16", k, v, b.sm(), kc,
           TensorView(b.vc.data(), DType::kF32, {4, 2, 16, 64}));
  b.expect("bf16_kv_write: value_cache is not contiguous; KV caches must be contiguous", k, v, b.sm(),
           TensorView(b.kc.data(), DType::kBF16, {2, 2, 16, 64}),
           TensorView::strided(b.vc.data(), DType::kBF16, {2, 2, 16, 64}, {4096, 1024, 64, 1}));
  b.expect("bf16_kv_write: key has shape [4, 2, 64] but the cache holds 2 kv heads of head_dim 32", k, v, b.sm(),
           TensorView(b.kc.data(), DType::kBF16, {4, 2, 16, 32}), TensorView(b.vc.data(), DType::kBF16, {4, 2, 16, 32}));
  b.expect("bf16_kv_write: slot_mapping has dtype int64 but must be int32", k, v,
           TensorView(b.slots.data(), DType::kI64, {2}), kc, vc);
  b.expect("bf16_kv_write: slot_mapping has shape [3] but must be [num_tokens] (flat slots) or [num_tokens, 2] "
           "([block, offset] pairs) with num_tokens = 4",
           k, v, TensorView(b.slots.data(), DType::kI32, {3}), kc, vc);
  b.slots = {0, 1, 64, 3};
  b.expect("bf16_kv_write: slot_mapping[2] = 64 is outside the cache's 64 slots (num_blocks * block_size)");
  b.slots = {-1, 1, 2, 3};
  b.expect("bf16_kv_write: slot_mapping[0] = -1 is outside the cache's 64 slots (num_blocks * block_size)");
  std::vector<int32_t> pairs = {0, 0, 4, 0, 1, 1, 2, 2};
  b.expect("bf16_kv_write: slot_mapping[1] = [4, 0] is outside the cache: block must be in [0, 4) and offset in "
           "[0, 16)",
           k, v, TensorView(pairs.data(), DType::kI32, {4, 2}), kc, vc);
  pairs = {0, 0, 1, 16, 1, 1, 2, 2};
  b.expect("bf16_kv_write: slot_mapping[1] = [1, 16] is outside the cache: block must be in [0, 4) and offset in "
           "[0, 16)",
           k, v, TensorView(pairs.data(), DType::kI32, {4, 2}), kc, vc);
}

}  // namespace
}  // namespace genbridge::testing
