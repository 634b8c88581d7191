#pragma once
// Stable operator kv_cache/bf16_indexer_key_write: stores the lightning indexer's key of new tokens into a
// bf16 paged key cache (IndexerKeyFormat::kBf16, kv_cache/kv_format.h).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// key: [num_tokens, index_head_dim] fp32/fp16/bf16, any strides. slot_mapping: int32, flat [num_tokens]
// or [num_tokens, 2] ([block, offset] pairs). cache.format == kBf16 with cache.key_cache bf16
// [num_blocks, block_size, index_head_dim]. Writes bf16(key) (RNE); tokens in order (a repeated slot keeps
// the last). Validates every argument and slot before writing anything; does not retain views.
Status bf16_indexer_key_write(const TensorView& key, const TensorView& slot_mapping, const IndexerKeyCache& cache);

}  // namespace genbridge::ops
