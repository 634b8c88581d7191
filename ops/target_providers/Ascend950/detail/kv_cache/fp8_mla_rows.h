#pragma once
// Internal: the fp8 MLA latent and fp8 indexer key row encoders behind kv_cache/fp8_mla_kv_write and
// kv_cache/fp8_indexer_key_write, private to this generation (the only one with an FP8 data path).

#include "ops/detail/kv_cache/mla_kv_write.h"

namespace genbridge::ops::detail {

// MlaKvFormat::kFp8TileScalePacked: per tile of 128 latent values scale = max(amax, kFp8KvScaleTinyAmax)
// / 448 (NaNs skipped), codes e4m3fn(x / scale); the row is codes, fp32 scales, bf16 rope.
TokenRowEncoder fp8_mla_row_encoder();
// IndexerKeyFormat::kFp8HadamardPackedScale: the key rotated (hadamard_rotate), then one scale for the row
// as above; the row is codes then the fp32 scale.
TokenRowEncoder fp8_indexer_row_encoder();

}  // namespace genbridge::ops::detail
