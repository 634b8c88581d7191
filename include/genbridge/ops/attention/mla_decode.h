#pragma once
// Stable operator attention/mla_decode: dense multi-head latent attention (MLA) in the absorbed form
// against a paged latent KV cache, for decode (one query token per sequence) and chunked prefill (several,
// causally masked). The caller folds W_UK into the query beforehand and applies W_UV to the output.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/kv_cache/kv_format.h"

namespace genbridge::ops {

// For query token t and head h, over the cached tokens s the query may see (causal, as in paged_decode):
//   score(s) = softmax_scale * (q_latent[t, h] . latent_s + q_rope[t, h] . rope_s)
//   out[t, h] = sum_s softmax(score)(s) * latent_s
// where latent_s and rope_s are token s's cached rows dequantized (MlaKvCache, kv_cache/kv_format.h; every
// MlaKvFormat the generation has; a representation it has not is Unimplemented naming the generation).
// q_latent: [num_query_tokens, num_heads, kv_lora_rank], q_rope: [num_query_tokens, num_heads, rope_dim],
//   fp32/fp16/bf16, any strides (they may differ in dtype); kv_lora_rank and rope_dim equal the cache's.
// block_tables: int32 [num_seqs, max_blocks_per_seq]; context_lens: int32 [num_seqs] (cached tokens of each
//   sequence, its query tokens included); query_start_loc: int32 [num_seqs + 1] (as attention/paged_decode:
//   query i of a sequence with q_len queries and context L sits at position L - q_len + i).
// out: [num_query_tokens, num_heads, kv_lora_rank] fp32 or bf16, any strides: the attention output in the
//   latent space, before W_UV. Scores, softmax and the weighted sum accumulate in fp32 over the tokens in
//   position order (online softmax); the result is bit-identical across runs, thread counts and CPU targets,
//   and a query's result does not depend on the other queries in the call. Validates everything before
//   writing; does not retain views.
Status mla_decode(const TensorView& q_latent, const TensorView& q_rope, const MlaKvCache& cache,
                  const TensorView& block_tables, const TensorView& context_lens, const TensorView& query_start_loc,
                  float softmax_scale, const TensorView& out);

}  // namespace genbridge::ops
