// Ascend950 (A5) provider: reads every KV representation, fp8 e4m3fn with packed fp32 scales included.
#include "genbridge/ops/attention/paged_decode.h"

#include "ops/detail/attention/paged_attention.h"

namespace genbridge::ops {

Status paged_decode(const TensorView& query, const PagedKvCache& cache, const TensorView& block_tables,
                    const TensorView& context_lens, const TensorView& query_start_loc, float softmax_scale,
                    const TensorView& out) {
  return detail::run_paged_decode({"paged_decode", query, cache, block_tables, context_lens, query_start_loc,
                                   softmax_scale, out});
}

}  // namespace genbridge::ops
