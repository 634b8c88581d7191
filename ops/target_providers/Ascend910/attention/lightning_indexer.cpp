// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/attention/lightning_indexer.h.
#include "genbridge/ops/attention/lightning_indexer.h"

namespace genbridge::ops {

Status lightning_indexer(const TensorView&, const TensorView&, const IndexerKeyCache&, const TensorView&, const TensorView&, const TensorView&, TopkIndexFormat, const TensorView&, const TensorView&) {
  return unimplemented("lightning_indexer: not implemented yet");
}

}  // namespace genbridge::ops
