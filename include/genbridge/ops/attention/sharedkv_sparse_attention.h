#pragma once
// Stable operator attention/sharedkv_sparse_attention: DeepSeek-V4's attention over one shared key = value
// head. Each query token attends to a list of cached rows, its sliding-window rows then its compressed
// rows, in one softmax whose denominator also holds a per-head attention sink; the value is the whole row
// (latent and rope parts), so the output keeps the rope part, which the caller rotates back.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// q_nope: [num_query_tokens, num_heads, L], q_rope: [num_query_tokens, num_heads, R] (L = kv_lora_rank and
// R = rope_dim of window_cache), fp32/fp16/bf16, any strides.
// window_slots: int32 [num_query_tokens, W] flat slots (block * block_size + offset) of window_cache;
// compressed_slots: int32 [num_query_tokens, C] flat slots of compressed_cache (C may be 0: the cache is
// then not read or checked). -1 entries are skipped wherever they are; a slot is not checked to belong to
// the query's sequence. Both caches are MLA caches (kv_cache/kv_format.h) of the same L and R, in any
// representation this build's generation reads.
// sinks: fp32 [num_heads] finite, or an empty view (no sink). softmax_scale: finite, > 0.
// For query t and head h, with k_j the dequantized rows of its list (window entries then compressed, in
// the order given) and s_j = softmax_scale * (q_nope . k_j[:L] + q_rope . k_j[L:]):
//   out[t, h] = sum_j exp(s_j) k_j / (sum_j exp(s_j) + exp(sinks[h]))   (the sink term only with sinks),
// a [L + R] row (latent then rope); a query with an empty list gets out = 0. Computed in fp32 with an online
// softmax over tiles of 16 list entries: the result depends only on the concatenated list, so moving the
// boundary between window and compressed entries (same rows, same order) gives the same bits.
// out: [num_query_tokens, num_heads, L + R], fp32 or bf16. Validates everything (every slot included)
// before writing; bit-identical across runs, thread counts and CPU targets; a query's result does not
// depend on the other queries; does not retain views.
Status sharedkv_sparse_attention(const TensorView& q_nope, const TensorView& q_rope, const MlaKvCache& window_cache,
                                 const TensorView& window_slots, const MlaKvCache& compressed_cache,
                                 const TensorView& compressed_slots, const TensorView& sinks, float softmax_scale,
                                 const TensorView& out);

}  // namespace genbridge::ops
