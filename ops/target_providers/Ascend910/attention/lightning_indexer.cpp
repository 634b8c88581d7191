// Ascend910 (A2/A3) provider: bf16 indexer keys. The generation has no FP8 data path, so fp8 keys are the
// explicit unsupported case (Unimplemented, before any other check).
#include "genbridge/ops/attention/lightning_indexer.h"

#include "ops/detail/attention/lightning_indexer_kernel.h"

namespace genbridge::ops {

Status lightning_indexer(const TensorView& q, const TensorView& weights, const IndexerKeyCache& keys,
                         const TensorView& block_tables, const TensorView& context_lens,
                         const TensorView& query_start_loc, TopkIndexFormat index_format,
                         const TensorView& topk_indices, const TensorView& topk_scores) {
  if (keys.format == IndexerKeyFormat::kFp8HadamardPackedScale) {
    return unimplemented(
        "lightning_indexer: fp8 indexer keys are not supported on Ascend910 (A2/A3 has no FP8 data path; its "
        "indexer keys are bf16)");
  }
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
