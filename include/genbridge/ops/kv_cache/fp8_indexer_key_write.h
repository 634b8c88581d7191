#pragma once
// Stable operator kv_cache/fp8_indexer_key_write: rotates the lightning indexer's key of new tokens by the
// normalized Walsh-Hadamard matrix and stores it as fp8 e4m3fn with one fp32 scale packed at the row end
// (IndexerKeyFormat::kFp8HadamardPackedScale, kv_cache/kv_format.h). A generation without an FP8 data
// path implements it as the explicit unsupported provider (Unimplemented, naming the op and the generation).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// key: [num_tokens, D] fp32/fp16/bf16 (D = index_head_dim, a power of two), any strides. slot_mapping:
// int32 [num_tokens] flat slots. cache.format == kFp8HadamardPackedScale with cache.key_cache uint8
// [num_blocks, block_size, D + 4]. Per token: y = fwht(fp32(key)) * fp32(1/sqrt(D)) (the in-place
// butterfly (a, b) -> (a + b, a - b) over strides 1, 2, 4, ..., D/2 in fp32, then one multiply), then
// scale = fp32(max(amax(|y|), kFp8KvScaleTinyAmax) / 448), code = e4m3fn(fp32(y / scale)) RNE saturated,
// scale stored little-endian after the D codes. Tokens in order; validates everything before writing;
// does not retain views.
Status fp8_indexer_key_write(const TensorView& key, const TensorView& slot_mapping, const IndexerKeyCache& cache);

}  // namespace genbridge::ops
