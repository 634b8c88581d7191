// The one table of KV-cache and indexer-key representations (kv_cache/kv_format.h).
#include "genbridge/ops/kv_cache/kv_format.h"

#include <array>
#include <string>

namespace genbridge::ops {
namespace {

enum Row : int {
  kGqaBf16,
  kGqaInt8,
  kGqaFp8,
  kMlaBf16,
  kMlaInt8,
  kMlaFp8,
  kIndexerBf16,
  kIndexerFp8,
  kNumRows,
};

using P = KvScalePlacement;
using R = KvRopePlacement;

// name, element, scale, scale placement, elements per scale (0 = per row), rope placement, Hadamard.
constexpr std::array<KvRepresentation, kNumRows> kTable = {{
    {kv_cache_format_name(KvCacheFormat::kBf16), DType::kBF16, DType::kF32, P::kNone, 0, R::kNone, false},
    {kv_cache_format_name(KvCacheFormat::kInt8Fp16Scale), DType::kI8, DType::kF16, P::kSeparateCache, 0, R::kNone,
     false},
    {kv_cache_format_name(KvCacheFormat::kFp8Fp32PackedScale), DType::kFp8E4M3FN, DType::kF32, P::kPackedInRow, 0,
     R::kNone, false},
    {mla_kv_format_name(MlaKvFormat::kBf16), DType::kBF16, DType::kF32, P::kNone, 0, R::kInRow, false},
    {mla_kv_format_name(MlaKvFormat::kInt8Fp16ScaleSplitRope), DType::kI8, DType::kF16, P::kSeparateCache, 0,
     R::kSeparateCache, false},
    {mla_kv_format_name(MlaKvFormat::kFp8TileScalePacked), DType::kFp8E4M3FN, DType::kF32, P::kPackedInRow,
     kMlaKvScaleTile, R::kInRow, false},
    {indexer_key_format_name(IndexerKeyFormat::kBf16), DType::kBF16, DType::kF32, P::kNone, 0, R::kNone, false},
    {indexer_key_format_name(IndexerKeyFormat::kFp8HadamardPackedScale), DType::kFp8E4M3FN, DType::kF32,
     P::kPackedInRow, 0, R::kNone, true},
}};

constexpr int64_t kRopeElementBytes = 2;  // the rope part is bf16 in every MLA representation

}  // namespace

const KvRepresentation& kv_representation(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kBf16: return kTable[kGqaBf16];
    case KvCacheFormat::kInt8Fp16Scale: return kTable[kGqaInt8];
    case KvCacheFormat::kFp8Fp32PackedScale: return kTable[kGqaFp8];
  }
  return kTable[kGqaBf16];
}

const KvRepresentation& kv_representation(MlaKvFormat f) {
  switch (f) {
    case MlaKvFormat::kBf16: return kTable[kMlaBf16];
    case MlaKvFormat::kInt8Fp16ScaleSplitRope: return kTable[kMlaInt8];
    case MlaKvFormat::kFp8TileScalePacked: return kTable[kMlaFp8];
  }
  return kTable[kMlaBf16];
}

const KvRepresentation& kv_representation(IndexerKeyFormat f) {
  switch (f) {
    case IndexerKeyFormat::kBf16: return kTable[kIndexerBf16];
    case IndexerKeyFormat::kFp8HadamardPackedScale: return kTable[kIndexerFp8];
  }
  return kTable[kIndexerBf16];
}

KvRowBytes kv_row_bytes(const KvRepresentation& r, int64_t width, int64_t rope_dim) {
  KvRowBytes b;
  b.main = width * static_cast<int64_t>(dtype_size(r.element));
  if (r.scale_placement != KvScalePlacement::kNone) {
    const int64_t scales = r.scale_group == 0 ? 1 : width / r.scale_group;
    const int64_t bytes = scales * static_cast<int64_t>(dtype_size(r.scale));
    (r.scale_placement == KvScalePlacement::kPackedInRow ? b.main : b.scale) += bytes;
  }
  if (r.rope_placement != KvRopePlacement::kNone) {
    (r.rope_placement == KvRopePlacement::kInRow ? b.main : b.rope) += rope_dim * kRopeElementBytes;
  }
  return b;
}

KvRowBytes gqa_kv_row_bytes(KvCacheFormat f, int64_t head_dim) { return kv_row_bytes(kv_representation(f), head_dim); }

KvRowBytes mla_kv_row_bytes(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim) {
  return kv_row_bytes(kv_representation(f), kv_lora_rank, rope_dim);
}

KvRowBytes indexer_key_row_bytes(IndexerKeyFormat f, int64_t index_head_dim) {
  return kv_row_bytes(kv_representation(f), index_head_dim);
}

Status check_mla_kv_dims(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim) {
  const KvRepresentation& r = kv_representation(f);
  if (kv_lora_rank < 1) {
    return invalid_argument("kv_lora_rank=" + std::to_string(kv_lora_rank) + " must be >= 1 for an MLA KV cache");
  }
  if (rope_dim < 0) {
    return invalid_argument("qk_rope_head_dim=" + std::to_string(rope_dim) + " must be >= 0 for an MLA KV cache");
  }
  if (r.scale_group > 0 && kv_lora_rank % r.scale_group != 0) {
    return invalid_argument("kv_lora_rank=" + std::to_string(kv_lora_rank) + " is not a multiple of " +
                            std::to_string(r.scale_group) + ", which the " + std::string(r.name) +
                            " MLA KV cache requires (one scale per tile of " + std::to_string(r.scale_group) +
                            " latent elements)");
  }
  return ok_status();
}

Status check_indexer_key_dims(IndexerKeyFormat f, int64_t index_head_dim) {
  const KvRepresentation& r = kv_representation(f);
  if (index_head_dim < 1) {
    return invalid_argument("index_head_dim=" + std::to_string(index_head_dim) + " must be >= 1 for an indexer key cache");
  }
  if (r.hadamard_rotated && (index_head_dim & (index_head_dim - 1)) != 0) {
    return invalid_argument("index_head_dim=" + std::to_string(index_head_dim) + " is not a power of two, which the " +
                            std::string(r.name) + " indexer key cache requires (Walsh-Hadamard rotation)");
  }
  return ok_status();
}

}  // namespace genbridge::ops
