// The one representation table (kv_cache/kv_format.h): every representation's element, scale and bytes
// per token, and the dimension rules with their exact messages. Runs unchanged in every target build.
#include "genbridge/ops/kv_cache/kv_format.h"

#include <gtest/gtest.h>

#include <vector>

namespace genbridge::ops {
namespace {

TEST(KvFormat, gqa_bytes_per_token_and_kv_head) {
  for (int64_t d : {64, 128, 256}) {
    EXPECT_EQ(gqa_kv_row_bytes(KvCacheFormat::kBf16, d).total(), 2 * d);
    EXPECT_EQ(gqa_kv_row_bytes(KvCacheFormat::kInt8Fp16Scale, d).main, d);
    EXPECT_EQ(gqa_kv_row_bytes(KvCacheFormat::kInt8Fp16Scale, d).scale, 2);
    EXPECT_EQ(gqa_kv_row_bytes(KvCacheFormat::kFp8Fp32PackedScale, d).main, d + 4);
    EXPECT_EQ(gqa_kv_row_bytes(KvCacheFormat::kFp8Fp32PackedScale, d).scale, 0);
  }
  EXPECT_EQ(gqa_kv_row_bytes(KvCacheFormat::kInt8Fp16Scale, 128).total(), 130);
  EXPECT_EQ(gqa_kv_row_bytes(KvCacheFormat::kFp8Fp32PackedScale, 128).total(), 132);
}

TEST(KvFormat, mla_bytes_per_token_at_deepseek_dims) {
  // kv_lora_rank 512, qk_rope_head_dim 64.
  const KvRowBytes bf16 = mla_kv_row_bytes(MlaKvFormat::kBf16, 512, 64);
  EXPECT_EQ(bf16.main, 2 * (512 + 64));
  EXPECT_EQ(bf16.total(), 1152);
  const KvRowBytes int8 = mla_kv_row_bytes(MlaKvFormat::kInt8Fp16ScaleSplitRope, 512, 64);
  EXPECT_EQ(int8.main, 512);
  EXPECT_EQ(int8.scale, 2);
  EXPECT_EQ(int8.rope, 128);
  EXPECT_EQ(int8.total(), 642);
  const KvRowBytes fp8 = mla_kv_row_bytes(MlaKvFormat::kFp8TileScalePacked, 512, 64);
  EXPECT_EQ(fp8.main, 512 + 16 + 128);
  EXPECT_EQ(fp8.main, 656);
  EXPECT_EQ(fp8.scale + fp8.rope, 0);
}

TEST(KvFormat, indexer_bytes_per_token) {
  EXPECT_EQ(indexer_key_row_bytes(IndexerKeyFormat::kBf16, 128).total(), 256);
  EXPECT_EQ(indexer_key_row_bytes(IndexerKeyFormat::kFp8HadamardPackedScale, 128).main, 132);
  EXPECT_EQ(indexer_key_row_bytes(IndexerKeyFormat::kFp8HadamardPackedScale, 128).total(), 132);
}

TEST(KvFormat, table_rows) {
  const KvRepresentation& a = kv_representation(MlaKvFormat::kInt8Fp16ScaleSplitRope);
  EXPECT_EQ(a.element, DType::kI8);
  EXPECT_EQ(a.scale, DType::kF16);
  EXPECT_EQ(a.scale_placement, KvScalePlacement::kSeparateCache);
  EXPECT_EQ(a.rope_placement, KvRopePlacement::kSeparateCache);
  const KvRepresentation& b = kv_representation(MlaKvFormat::kFp8TileScalePacked);
  EXPECT_EQ(b.element, DType::kFp8E4M3FN);
  EXPECT_EQ(b.scale, DType::kF32);
  EXPECT_EQ(b.scale_placement, KvScalePlacement::kPackedInRow);
  EXPECT_EQ(b.scale_group, kMlaKvScaleTile);
  EXPECT_EQ(b.rope_placement, KvRopePlacement::kInRow);
  const KvRepresentation& c = kv_representation(IndexerKeyFormat::kFp8HadamardPackedScale);
  EXPECT_TRUE(c.hadamard_rotated);
  EXPECT_EQ(c.scale_placement, KvScalePlacement::kPackedInRow);
  EXPECT_EQ(kv_representation(KvCacheFormat::kFp8Fp32PackedScale).scale_placement, KvScalePlacement::kPackedInRow);
  EXPECT_EQ(kv_representation(KvCacheFormat::kInt8Fp16Scale).scale_placement, KvScalePlacement::kSeparateCache);
  EXPECT_EQ(kv_representation(KvCacheFormat::kBf16).scale_placement, KvScalePlacement::kNone);
  EXPECT_EQ(kv_representation(KvCacheFormat::kBf16).name, "bf16");
}

TEST(KvFormat, element_and_scale_bytes_agree_with_the_dtypes) {
  const std::vector<const KvRepresentation*> all = {
      &kv_representation(KvCacheFormat::kBf16),           &kv_representation(KvCacheFormat::kInt8Fp16Scale),
      &kv_representation(KvCacheFormat::kFp8Fp32PackedScale), &kv_representation(MlaKvFormat::kBf16),
      &kv_representation(MlaKvFormat::kInt8Fp16ScaleSplitRope), &kv_representation(MlaKvFormat::kFp8TileScalePacked),
      &kv_representation(IndexerKeyFormat::kBf16), &kv_representation(IndexerKeyFormat::kFp8HadamardPackedScale)};
  for (const KvRepresentation* r : all) {
    EXPECT_EQ(r->element_bytes, static_cast<int64_t>(dtype_size(r->element))) << r->name;
    EXPECT_EQ(r->scale_bytes, r->scale_placement == KvScalePlacement::kNone ? 0 : static_cast<int64_t>(dtype_size(r->scale)))
        << r->name;
  }
}

TEST(KvFormat, dimension_rules_name_the_key) {
  EXPECT_TRUE(check_mla_kv_dims(MlaKvFormat::kFp8TileScalePacked, 512, 64).ok());
  EXPECT_TRUE(check_mla_kv_dims(MlaKvFormat::kInt8Fp16ScaleSplitRope, 100, 0).ok());
  const Status st = check_mla_kv_dims(MlaKvFormat::kFp8TileScalePacked, 100, 64);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "kv_lora_rank=100 is not a multiple of 128, which the fp8_e4m3fn latent+fp32 scale per 128+bf16 rope, "
            "packed MLA KV cache requires (one scale per tile of 128 latent elements)");
  EXPECT_EQ(check_mla_kv_dims(MlaKvFormat::kBf16, 0, 64).message(),
            "kv_lora_rank=0 must be >= 1 for an MLA KV cache");
  EXPECT_EQ(check_mla_kv_dims(MlaKvFormat::kBf16, 64, -1).message(),
            "qk_rope_head_dim=-1 must be >= 0 for an MLA KV cache");
  EXPECT_TRUE(check_indexer_key_dims(IndexerKeyFormat::kBf16, 96).ok());
  EXPECT_EQ(check_indexer_key_dims(IndexerKeyFormat::kFp8HadamardPackedScale, 96).message(),
            "index_head_dim=96 is not a power of two, which the fp8_e4m3fn (Hadamard-rotated)+packed fp32 scale "
            "indexer key cache requires (Walsh-Hadamard rotation)");
}

}  // namespace
}  // namespace genbridge::ops
