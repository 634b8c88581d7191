#pragma once
// Stable operator kv_cache/fp8_kv_write: quantizes K/V rows of new tokens into an fp8 e4m3fn paged cache
// whose rows carry their own fp32 scale. A generation without an FP8 data path implements it as the
// explicit unsupported provider (Unimplemented, naming the op and the generation).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// The amax below which a row's scale is clamped: 448 * 2^-149, so the fp32 scale is never 0.
inline constexpr float kFp8KvScaleTinyAmax = 448.0f * 0x1p-149f;

// key, value: [num_tokens, num_kv_heads, head_dim] fp32/fp16/bf16 (value has key's shape and dtype), any
// strides. slot_mapping: int32 [num_tokens] flat slots (block * block_size + offset). key_cache,
// value_cache: contiguous uint8 [num_blocks, num_kv_heads, block_size, head_dim + 4] (the
// kFp8Fp32PackedScale layout of attention/paged_decode). Per (token, kv head) row x:
// scale = fp32(max(amax(|x|), kFp8KvScaleTinyAmax) / 448), stored in the row's last 4 bytes, and
// code = e4m3fn(fp32(x / scale)) rounded to nearest even and saturated to +-448. Tokens are written in
// order (a repeated slot keeps the last). Validates every argument and slot before writing anything;
// does not retain views.
Status fp8_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                    const TensorView& key_cache, const TensorView& value_cache);

}  // namespace genbridge::ops
