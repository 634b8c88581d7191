#pragma once
// Stable operator kv_cache/int8_kv_write: quantizes K/V rows of new tokens into an int8 paged cache
// with one fp16 scale per (token, kv head) in separate scale caches.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// The amax below which a row's scale is clamped: 127 * 2^-24, so the stored fp16 scale is never 0.
inline constexpr float kInt8KvScaleTinyAmax = 127.0f * 0x1p-24f;

// key, value: [num_tokens, num_kv_heads, head_dim] fp32/fp16/bf16 (value has key's shape and dtype), any
// strides. slot_mapping: int32 [num_tokens, 2] ([block, offset] pairs). key_cache, value_cache: contiguous
// int8 [num_blocks, num_kv_heads, block_size, head_dim]; key_scale_cache, value_scale_cache: contiguous
// fp16 [num_blocks, num_kv_heads, block_size] (the kInt8Fp16Scale layout of attention/paged_decode).
// Per (token, kv head) row x: scale = fp16(fp32(max(amax(|x|), kInt8KvScaleTinyAmax) / 127)) and
// code = clamp(rne(fp32(x / scale)), -127, 127), dividing by the stored (rounded) scale so that
// code * scale dequantizes consistently. Tokens are written in order (a repeated slot keeps the last).
// Validates every argument and slot before writing anything; does not retain views.
Status int8_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                     const TensorView& key_cache, const TensorView& value_cache, const TensorView& key_scale_cache,
                     const TensorView& value_scale_cache);

}  // namespace genbridge::ops
