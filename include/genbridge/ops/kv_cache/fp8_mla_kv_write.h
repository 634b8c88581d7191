#pragma once
// Stable operator kv_cache/fp8_mla_kv_write: quantizes the MLA latent of new tokens to fp8 e4m3fn in tiles
// of 128 with one fp32 scale per tile, packed with the bf16 rope key in one row
// (MlaKvFormat::kFp8TileScalePacked, kv_cache/kv_format.h). A generation without an FP8 data path
// implements it as the explicit unsupported provider (Unimplemented, naming the op and the generation).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// latent: [num_tokens, kv_lora_rank] (kv_lora_rank a multiple of kMlaKvScaleTile), rope: [num_tokens,
// rope_dim], fp32/fp16/bf16, any strides. slot_mapping: int32 [num_tokens] flat slots. cache.format ==
// kFp8TileScalePacked with cache.kv_cache uint8 [num_blocks, block_size, mla_kv_row_bytes(...).main].
// Per tile x of 128 latent elements: scale = fp32(max(amax(|x|), kFp8KvScaleTinyAmax) / 448) and
// code = e4m3fn(fp32(x / scale)) RNE, saturated to +-448 (the rule of fp8_kv_write, per tile); rope =
// bf16(rope) (RNE). Tokens in order; validates everything before writing; does not retain views.
Status fp8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                        const MlaKvCache& cache);

}  // namespace genbridge::ops
