#pragma once
// Stable operator attention/lightning_indexer: DeepSeek sparse attention's indexer. Scores every cached
// token a query token may see and selects the index_topk best for sparse_mla_decode.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// For query token t at position p (as attention/paged_decode) and every cached position s <= p of its
// sequence:
//   score(t, s) = sum_h weights[t, h] * ReLU(q[t, h] . k_s)
// with k_s the cached indexer key (IndexerKeyCache, kv_cache/kv_format.h; for kFp8HadamardPackedScale the
// query is rotated by the same normalized Hadamard matrix in fp32 and dotted with the dequantized codes,
// so scores match the unrotated ones up to fp8 rounding). Dots accumulate in fp32 in the 16-lane contract
// order; the head sum is fp32 in head order, h = 0 first. The top-k are the index_topk = topk_indices.dim(1)
// highest scores, ties broken by the lower position (NaN scores rank below every number); when p + 1 <=
// index_topk every position 0..p is selected. Row t of topk_indices lists the selected positions in
// increasing order, in `index_format` (positions within the sequence or flat KV slots, read through
// block_tables), then -1 up to index_topk.
// q: [num_query_tokens, index_n_heads, index_head_dim] fp32/fp16/bf16 (RoPE applied), any strides.
// weights: [num_query_tokens, index_n_heads] fp32/fp16/bf16, any strides (already scaled by the caller).
// block_tables, context_lens, query_start_loc: as attention/paged_decode.
// topk_indices: int32 [num_query_tokens, index_topk], index_topk >= 1, any strides.
// topk_scores: fp32 [num_query_tokens, index_topk] receiving the selected scores in the same order (0 for
//   padding), or a default-constructed TensorView (data null) when not wanted.
// Bit-identical across runs, thread counts and CPU targets; a query's result does not depend on the other
// queries. Validates everything before writing; does not retain views.
Status lightning_indexer(const TensorView& q, const TensorView& weights, const IndexerKeyCache& keys,
                         const TensorView& block_tables, const TensorView& context_lens,
                         const TensorView& query_start_loc, TopkIndexFormat index_format,
                         const TensorView& topk_indices, const TensorView& topk_scores);

}  // namespace genbridge::ops
