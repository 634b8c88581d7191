// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/kv_cache/fp8_indexer_key_write.h.
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"

namespace genbridge::ops {

Status fp8_indexer_key_write(const TensorView&, const TensorView&, const IndexerKeyCache&) {
  return unimplemented("fp8_indexer_key_write: not implemented yet");
}

}  // namespace genbridge::ops
