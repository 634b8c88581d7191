// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/kv_cache/bf16_indexer_key_write.h.
#include "genbridge/ops/kv_cache/bf16_indexer_key_write.h"

namespace genbridge::ops {

Status bf16_indexer_key_write(const TensorView&, const TensorView&, const IndexerKeyCache&) {
  return unimplemented("bf16_indexer_key_write: not implemented yet");
}

}  // namespace genbridge::ops
