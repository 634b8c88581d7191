// Ascend950 (A5) provider: reads every MLA KV representation, the packed fp8 one included.
#include "genbridge/ops/attention/sparse_mla_decode.h"

#include "ops/detail/attention/mla_attention.h"

namespace genbridge::ops {

Status sparse_mla_decode(const TensorView& q_latent, const TensorView& q_rope, const MlaKvCache& cache,
                         const TensorView& topk_indices, TopkIndexFormat index_format, const TensorView& block_tables,
                         const TensorView& context_lens, const TensorView& query_start_loc, float softmax_scale,
                         const TensorView& out) {
  return detail::run_mla_attention({.op = "sparse_mla_decode",
                                     .q_latent = q_latent,
                                     .q_rope = q_rope,
                                     .cache = cache,
                                     .block_tables = block_tables,
                                     .context_lens = context_lens,
                                     .query_start_loc = query_start_loc,
                                     .sparse = true,
                                     .topk_indices = topk_indices,
                                     .index_format = index_format,
                                     .softmax_scale = softmax_scale,
                                     .out = out});
}

}  // namespace genbridge::ops
