#pragma once
// Internal: the fp8 KV-cache row encoders behind kv_cache/fp8_kv_write, kv_cache/fp8_mla_kv_write and
// kv_cache/fp8_indexer_key_write, private to this generation (the only one with an FP8 data path): only
// this target's library compiles them. Every group of values shares one rule: scale = max(amax(|x|),
// kFp8KvScaleTinyAmax) / 448 (NaNs skipped), code i = e4m3fn(x[i] / scale), saturating.

#include <cstdint>

#include "ops/common/kv_cache/mla_kv_write.h"

namespace genbridge::ops::detail {

// KvCacheFormat::kFp8Fp32PackedScale: one row of head_dim values as codes followed by the row's fp32
// scale (4 bytes).
using Fp8KvRowEncoder = void (*)(const float* x, int64_t head_dim, uint8_t* row);

// The encoders compiled for the CPU target in use (core/simd/): chosen once per op call.
Fp8KvRowEncoder fp8_kv_row_encoder();
// MlaKvFormat::kFp8TileScalePacked: one scale per tile of 128 latent values; the row is codes, fp32
// scales, bf16 rope.
TokenRowEncoder fp8_mla_row_encoder();
// MlaKvFormat::kMxfp8RopeFirstPacked: bf16 rope, then codes with one power-of-two E8M0 scale per 64
// latent values (kv_cache/mxfp8_mla_kv_write.h), zero padding to the row's end.
TokenRowEncoder mxfp8_mla_row_encoder();
// IndexerKeyFormat::kFp8HadamardPackedScale: the key rotated (hadamard_rotate), then one scale for the
// row; the row is codes then the fp32 scale.
TokenRowEncoder fp8_indexer_row_encoder();

}  // namespace genbridge::ops::detail
