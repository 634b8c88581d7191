// Common to every target: the kernel reads every KV representation; a generation without one answers
// Unimplemented for it (kv_reads.h).
#include "genbridge/ops/attention/paged_decode.h"

#include "ops/common/attention/kv_reads.h"
#include "ops/common/attention/paged_attention.h"

namespace genbridge::ops {

Status paged_decode(const TensorView& query, const PagedKvCache& cache, const TensorView& block_tables,
                    const TensorView& context_lens, const TensorView& query_start_loc, float softmax_scale,
                    const TensorView& out) {
  GB_RETURN_IF_ERROR(detail::check_kv_readable("paged_decode", cache.format));
  return detail::run_paged_decode(
      {"paged_decode", query, cache, block_tables, context_lens, query_start_loc, softmax_scale, out});
}

}  // namespace genbridge::ops
