// Common to every target: the kernel reads every indexer key representation; a generation without one
// answers Unimplemented for it (kv_reads.h).
#include "genbridge/ops/attention/lightning_indexer.h"

#include "ops/common/attention/kv_reads.h"
#include "ops/common/attention/lightning_indexer_kernel.h"

namespace genbridge::ops {

Status lightning_indexer(const TensorView& q, const TensorView& weights, const IndexerKeyCache& keys,
                         const TensorView& block_tables, const TensorView& context_lens,
                         const TensorView& query_start_loc, TopkIndexFormat index_format,
                         const TensorView& topk_indices, const TensorView& topk_scores) {
  GB_RETURN_IF_ERROR(detail::check_kv_readable("lightning_indexer", keys.format));
  return detail::run_lightning_indexer({"lightning_indexer", q, weights, keys, block_tables, context_lens,
                                        query_start_loc, index_format, topk_indices, topk_scores});
}

}  // namespace genbridge::ops
