// Common to every target: the MLA kernel over the selected positions; a generation without an MLA KV
// representation answers Unimplemented for it (kv_reads.h).
#include "genbridge/ops/attention/sparse_mla_decode.h"

#include "ops/common/attention/kv_reads.h"
#include "ops/common/attention/mla_attention.h"

namespace genbridge::ops {

Status sparse_mla_decode(const TensorView& q_latent, const TensorView& q_rope, const MlaKvCache& cache,
                         const TensorView& topk_indices, TopkIndexFormat index_format, const TensorView& block_tables,
                         const TensorView& context_lens, const TensorView& query_start_loc, float softmax_scale,
                         const TensorView& out) {
  GB_RETURN_IF_ERROR(detail::check_kv_readable("sparse_mla_decode", cache.format));
  return detail::run_mla_attention({"sparse_mla_decode", q_latent, q_rope, cache, block_tables, context_lens,
                                    query_start_loc, /*sparse=*/true, topk_indices, index_format, softmax_scale, out});
}

}  // namespace genbridge::ops
