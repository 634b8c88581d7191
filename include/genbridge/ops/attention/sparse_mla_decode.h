#pragma once
// Stable operator attention/sparse_mla_decode: MLA in the absorbed form (as attention/mla_decode) over the
// cached tokens the lightning indexer selected for each query token (DeepSeek sparse attention).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// As mla_decode, but query token t attends only to the cached tokens named by row t of topk_indices:
//   topk_indices: int32 [num_query_tokens, index_topk], any strides, in the contract `index_format`
//     (kv_cache/kv_format.h): kSequencePositions = positions within t's sequence, each <= t's position
//     (read through block_tables); kFlatKvSlots = flat slots block * block_size + offset, each
//     < num_blocks * block_size (a slot is not checked to belong to t's sequence). -1 entries are skipped
//     wherever they are; a query with no entry gets out = 0. Entries are attended in the order given (the
//     indexer gives them in increasing position), so with every position of the context listed in order
//     the result equals mla_decode's bit for bit.
// q_latent, q_rope, cache, block_tables, context_lens, query_start_loc, softmax_scale, out: as mla_decode.
// Validates everything (every index included) before writing; bit-identical across runs, thread counts
// and CPU targets; a query's result does not depend on the other queries; does not retain views.
Status sparse_mla_decode(const TensorView& q_latent, const TensorView& q_rope, const MlaKvCache& cache,
                         const TensorView& topk_indices, TopkIndexFormat index_format, const TensorView& block_tables,
                         const TensorView& context_lens, const TensorView& query_start_loc, float softmax_scale,
                         const TensorView& out);

}  // namespace genbridge::ops
