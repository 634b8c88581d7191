// Ascend950 (A5) provider: every indexer key representation, the Hadamard-rotated fp8 one included.
#include "genbridge/ops/attention/lightning_indexer.h"

#include "ops/detail/attention/lightning_indexer_kernel.h"

namespace genbridge::ops {

Status lightning_indexer(const TensorView& q, const TensorView& weights, const IndexerKeyCache& keys,
                         const TensorView& block_tables, const TensorView& context_lens,
                         const TensorView& query_start_loc, TopkIndexFormat index_format,
                         const TensorView& topk_indices, const TensorView& topk_scores) {
  detail::LightningIndexerCall c;
  c.op = "lightning_indexer";
  c.q = q;
  c.weights = weights;
  c.keys = keys;
  c.block_tables = block_tables;
  c.context_lens = context_lens;
  c.query_start_loc = query_start_loc;
  c.index_format = index_format;
  c.topk_indices = topk_indices;
  c.topk_scores = topk_scores;
  return detail::run_lightning_indexer(c);
}

}  // namespace genbridge::ops
