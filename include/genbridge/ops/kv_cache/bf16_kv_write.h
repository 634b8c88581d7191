#pragma once
// Stable operator kv_cache/bf16_kv_write: stores K/V rows of new tokens into a bf16 paged cache.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// key, value: [num_tokens, num_kv_heads, head_dim] fp32/fp16/bf16 (value has key's shape and dtype), any
// strides. slot_mapping: int32, either flat [num_tokens] (slot = block * block_size + offset) or
// [num_tokens, 2] ([block, offset] pairs). key_cache, value_cache: contiguous bf16
// [num_blocks, num_kv_heads, block_size, head_dim] (the kBf16 layout of attention/paged_decode).
// Writes row [block, h, offset] of both caches for every token and kv head (RNE to bf16); tokens are
// written in order, so a repeated slot keeps the last token. Validates every argument and slot before
// writing anything; writes nothing else; does not retain views.
Status bf16_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                     const TensorView& key_cache, const TensorView& value_cache);

}  // namespace genbridge::ops
