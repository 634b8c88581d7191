#pragma once
// kv_cache/kv_format: the one table of every KV-cache and indexer-key representation the library writes
// and reads (docs/design.md#deviceoperator-contract). Writers, attention operators, the memory pool's geometry and the
// DeviceOperator all take element types, scale placement and row bytes from here; no size is written
// twice. Also the one slot-mapping enum and the top-k index contract of sparse attention.

#include <cstdint>
#include <string_view>

#include "genbridge/core/dtype.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// How a KV writer is told where each token goes (every writer and the DeviceOperator use this enum).
enum class SlotMapping {
  kFlat,              // int32 [num_tokens]: block * block_size + offset
  kBlockOffsetPairs,  // int32 [num_tokens, 2]: [block, offset]
};

// GQA K/V rows, one per (token, kv head), K and V alike (layouts: attention/paged_decode.h).
enum class KvCacheFormat { kBf16, kInt8Fp16Scale, kFp8Fp32PackedScale };

// MLA latent KV rows, one per token (MLA has one latent "head"): the kv_lora_rank-wide latent (the values
// and the non-rope part of the keys, after kv_a_layernorm) and the rope_dim-wide decoupled RoPE key.
//   kBf16:                    kv_cache bf16 [num_blocks, block_size, kv_lora_rank + rope_dim]: latent, then rope.
//   kInt8Fp16ScaleSplitRope:  kv_cache int8 [num_blocks, block_size, kv_lora_rank] (latent codes),
//                             scale_cache fp16 [num_blocks, block_size] (one scale per token; value = code * scale),
//                             rope_cache bf16 [num_blocks, block_size, rope_dim].
//   kFp8TileScalePacked:      kv_cache uint8 [num_blocks, block_size, kv_lora_rank + 4 * kv_lora_rank / 128 +
//                             2 * rope_dim]: kv_lora_rank fp8 e4m3fn codes, then one little-endian fp32 scale per
//                             tile of kMlaKvScaleTile latent elements (value = code * its tile's scale), then the
//                             rope as bf16. kv_lora_rank must be a multiple of kMlaKvScaleTile.
//   kMxfp8RopeFirstPacked:    kv_cache uint8 [num_blocks, block_size, round_up(2 * rope_dim + kv_lora_rank +
//                             kv_lora_rank / 64, 128)]: the rope as bf16 first, then kv_lora_rank fp8 e4m3fn
//                             codes, then one E8M0 byte per group of kMxKvScaleGroup codes (value = code *
//                             2^(byte - 127)), then zero bytes up to the next multiple of kKvRowAlign. The shared
//                             K = V row of DeepSeek-V4 (448 codes + 64 rope: 583 bytes, 640 with the padding).
//                             kv_lora_rank must be a multiple of kMxKvScaleGroup.
enum class MlaKvFormat { kBf16, kInt8Fp16ScaleSplitRope, kFp8TileScalePacked, kMxfp8RopeFirstPacked };

// DSA (lightning indexer) key rows, one per token, index_head_dim wide.
//   kBf16:                    key_cache bf16 [num_blocks, block_size, index_head_dim].
//   kFp8HadamardPackedScale:  key_cache uint8 [num_blocks, block_size, index_head_dim + 4]: the key rotated by
//                             the normalized Walsh-Hadamard matrix H / sqrt(index_head_dim) (orthogonal, so q.k is
//                             unchanged in exact arithmetic), as fp8 e4m3fn codes, then one little-endian fp32
//                             scale for the row. index_head_dim must be a power of two.
enum class IndexerKeyFormat { kBf16, kFp8HadamardPackedScale };

// What the indexer hands sparse attention: int32 [num_query_tokens, index_topk], -1 padded.
enum class TopkIndexFormat {
  kSequencePositions,  // positions within the query's own sequence ("legacy" contract)
  kFlatKvSlots,        // flat KV slots block * block_size + offset of the query's own sequence
};

// Elements per fp32 scale of kFp8TileScalePacked.
inline constexpr int64_t kMlaKvScaleTile = 128;
// Elements per E8M0 scale byte of kMxfp8RopeFirstPacked, and the multiple its rows are padded to.
inline constexpr int64_t kMxKvScaleGroup = 64;
inline constexpr int64_t kKvRowAlign = 128;

enum class KvScalePlacement {
  kNone,           // unscaled (bf16)
  kSeparateCache,  // scales in a cache of their own, one entry per row
  kPackedInRow,    // scale bytes inside the row, right after the elements they scale
};
enum class KvRopePlacement {
  kNone,           // no separate rope part (GQA, indexer keys)
  kInRow,          // bf16 rope at the end of the row
  kSeparateCache,  // bf16 rope in a cache of its own
};

// One row of the table: what a representation's rows hold.
struct KvRepresentation {
  std::string_view name;            // used in messages and logs
  DType element;                    // dtype of the K / V / latent / indexer-key elements
  int64_t element_bytes;            // bytes per element
  DType scale;                      // dtype of a scale (kF32 when scale_placement == kNone; unused then)
  int64_t scale_bytes;              // bytes per scale (0 when unscaled)
  KvScalePlacement scale_placement;
  int64_t scale_group;              // elements per scale; 0 = one scale per row
  KvRopePlacement rope_placement;   // MLA only; the rope part is bf16 (kKvRopeElementBytes per element)
  bool hadamard_rotated;            // elements are of H k / sqrt(width) (indexer fp8 keys)
  bool rope_first = false;          // kInRow rope at the start of the row instead of the end
  int64_t row_align = 0;            // main rows padded with zero bytes to a multiple of this (0: none)
};

// Bytes per element of the MLA rope part (bf16 in every representation).
inline constexpr int64_t kKvRopeElementBytes = 2;

// Bytes of one row of each cache a representation uses.
struct KvRowBytes {
  int64_t main = 0;   // the main cache's row, in-row scales and in-row rope included
  int64_t scale = 0;  // one entry of the separate scale cache (0: none)
  int64_t rope = 0;   // one row of the separate rope cache (0: none)
  constexpr int64_t total() const { return main + scale + rope; }
};

namespace kv_format_detail {
using P = KvScalePlacement;
using R = KvRopePlacement;
// THE table. name, element, bytes, scale, bytes, scale placement, elements per scale (0 = per row), rope
// placement, Hadamard rotation.
inline constexpr KvRepresentation kGqaBf16{"bf16", DType::kBF16, 2, DType::kF32, 0, P::kNone, 0, R::kNone, false};
inline constexpr KvRepresentation kGqaInt8{"int8+fp16 scale", DType::kI8, 1, DType::kF16, 2, P::kSeparateCache, 0,
                                           R::kNone, false};
inline constexpr KvRepresentation kGqaFp8{"fp8_e4m3fn+packed fp32 scale", DType::kFp8E4M3FN, 1, DType::kF32, 4,
                                          P::kPackedInRow, 0, R::kNone, false};
inline constexpr KvRepresentation kMlaBf16{"bf16 latent+rope", DType::kBF16, 2, DType::kF32, 0, P::kNone, 0, R::kInRow,
                                           false};
inline constexpr KvRepresentation kMlaInt8{"int8 latent+fp16 scale, bf16 rope cache", DType::kI8, 1, DType::kF16, 2,
                                           P::kSeparateCache, 0, R::kSeparateCache, false};
inline constexpr KvRepresentation kMlaFp8{"fp8_e4m3fn latent+fp32 scale per 128+bf16 rope, packed", DType::kFp8E4M3FN, 1,
                                          DType::kF32, 4, P::kPackedInRow, kMlaKvScaleTile, R::kInRow, false};
inline constexpr KvRepresentation kMlaMxfp8{"bf16 rope+fp8_e4m3fn latent+E8M0 scale per 64, packed",
                                            DType::kFp8E4M3FN, 1, DType::kE8M0, 1, P::kPackedInRow, kMxKvScaleGroup,
                                            R::kInRow, false, /*rope_first=*/true, /*row_align=*/kKvRowAlign};
inline constexpr KvRepresentation kIndexerBf16{"bf16", DType::kBF16, 2, DType::kF32, 0, P::kNone, 0, R::kNone, false};
inline constexpr KvRepresentation kIndexerFp8{"fp8_e4m3fn (Hadamard-rotated)+packed fp32 scale", DType::kFp8E4M3FN, 1,
                                              DType::kF32, 4, P::kPackedInRow, 0, R::kNone, true};
}  // namespace kv_format_detail

// The table's row of each representation (entries never change).
constexpr const KvRepresentation& kv_representation(KvCacheFormat f) {
  return f == KvCacheFormat::kInt8Fp16Scale        ? kv_format_detail::kGqaInt8
         : f == KvCacheFormat::kFp8Fp32PackedScale ? kv_format_detail::kGqaFp8
                                                   : kv_format_detail::kGqaBf16;
}
constexpr const KvRepresentation& kv_representation(MlaKvFormat f) {
  return f == MlaKvFormat::kInt8Fp16ScaleSplitRope ? kv_format_detail::kMlaInt8
         : f == MlaKvFormat::kFp8TileScalePacked   ? kv_format_detail::kMlaFp8
         : f == MlaKvFormat::kMxfp8RopeFirstPacked ? kv_format_detail::kMlaMxfp8
                                                   : kv_format_detail::kMlaBf16;
}
constexpr const KvRepresentation& kv_representation(IndexerKeyFormat f) {
  return f == IndexerKeyFormat::kFp8HadamardPackedScale ? kv_format_detail::kIndexerFp8 : kv_format_detail::kIndexerBf16;
}

// Row bytes of representation `r` for rows of `width` elements (GQA head_dim, MLA kv_lora_rank, indexer
// head_dim) plus `rope_dim` bf16 rope elements (MLA; 0 otherwise). width must be a multiple of
// r.scale_group when that is non-zero (the callers check it with a message first).
constexpr KvRowBytes kv_row_bytes(const KvRepresentation& r, int64_t width, int64_t rope_dim = 0) {
  KvRowBytes b;
  b.main = width * r.element_bytes;
  if (r.scale_placement != KvScalePlacement::kNone) {
    const int64_t bytes = (r.scale_group == 0 ? 1 : width / r.scale_group) * r.scale_bytes;
    (r.scale_placement == KvScalePlacement::kPackedInRow ? b.main : b.scale) += bytes;
  }
  if (r.rope_placement != KvRopePlacement::kNone) {
    (r.rope_placement == KvRopePlacement::kInRow ? b.main : b.rope) += rope_dim * kKvRopeElementBytes;
  }
  if (r.row_align > 0) b.main = (b.main + r.row_align - 1) / r.row_align * r.row_align;
  return b;
}
// Per (token, kv head), K or V: bf16 2d; int8 d + side 2; fp8 d + 4.
constexpr KvRowBytes gqa_kv_row_bytes(KvCacheFormat f, int64_t head_dim) {
  return kv_row_bytes(kv_representation(f), head_dim);
}
// Per token: bf16 2 (L + R); int8 L + scale 2 + rope 2R; fp8 L + 4 L / 128 + 2R (656 at L = 512, R = 64); mxfp8
// round_up(2R + L + L / 64, 128) (640 at L = 448, R = 64).
constexpr KvRowBytes mla_kv_row_bytes(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim) {
  return kv_row_bytes(kv_representation(f), kv_lora_rank, rope_dim);
}
// Per token: bf16 2D; fp8 D + 4 (132 at D = 128).
constexpr KvRowBytes indexer_key_row_bytes(IndexerKeyFormat f, int64_t index_head_dim) {
  return kv_row_bytes(kv_representation(f), index_head_dim);
}
static_assert(gqa_kv_row_bytes(KvCacheFormat::kFp8Fp32PackedScale, 128).total() == 132);
static_assert(mla_kv_row_bytes(MlaKvFormat::kFp8TileScalePacked, 512, 64).total() == 656);
static_assert(mla_kv_row_bytes(MlaKvFormat::kMxfp8RopeFirstPacked, 448, 64).total() == 640);
static_assert(mla_kv_row_bytes(MlaKvFormat::kBf16, 448, 64).total() == 1024);
static_assert(indexer_key_row_bytes(IndexerKeyFormat::kFp8HadamardPackedScale, 128).total() == 132);

// Checks that representation `f` can hold rows of these dimensions (InvalidArgument naming `what`, the
// value and the rule: kv_lora_rank a multiple of 128 for fp8 tiles, index_head_dim a power of two for
// the Hadamard rotation, every dimension >= 1, rope_dim >= 0).
Status check_mla_kv_dims(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim);
Status check_indexer_key_dims(IndexerKeyFormat f, int64_t index_head_dim);

// Names used in messages and logs (the table's).
constexpr std::string_view kv_cache_format_name(KvCacheFormat f) { return kv_representation(f).name; }
constexpr std::string_view mla_kv_format_name(MlaKvFormat f) { return kv_representation(f).name; }
constexpr std::string_view indexer_key_format_name(IndexerKeyFormat f) { return kv_representation(f).name; }
constexpr std::string_view topk_index_format_name(TopkIndexFormat f) {
  return f == TopkIndexFormat::kSequencePositions ? "int32 sequence positions, -1 padded"
                                                  : "int32 flat KV slots (block * block_size + offset), -1 padded";
}

// One layer's MLA KV cache in one representation (layouts above). Views only: the memory pool owns the
// bytes. Every cache view is contiguous; a token's slot is block * block_size + offset.
struct MlaKvCache {
  MlaKvFormat format = MlaKvFormat::kBf16;
  int64_t kv_lora_rank = 0;
  int64_t rope_dim = 0;
  TensorView kv_cache;
  TensorView scale_cache;  // kInt8Fp16ScaleSplitRope only; ignored otherwise
  TensorView rope_cache;   // kInt8Fp16ScaleSplitRope only; ignored otherwise
};

// One layer's indexer key cache (layouts above). A view only.
struct IndexerKeyCache {
  IndexerKeyFormat format = IndexerKeyFormat::kBf16;
  int64_t head_dim = 0;  // index_head_dim
  TensorView key_cache;
};

}  // namespace genbridge::ops
