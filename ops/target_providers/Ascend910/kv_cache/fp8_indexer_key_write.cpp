// Ascend910 (A2/A3) provider: the explicit unsupported one (docs/design.md#provider-staging). The generation has no FP8
// data path; its indexer keys are bf16 (kv_cache/bf16_indexer_key_write).
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"

namespace genbridge::ops {

Status fp8_indexer_key_write(const TensorView&, const TensorView&, const IndexerKeyCache&) {
  return unimplemented(
      "fp8_indexer_key_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its indexer keys are bf16, "
      "written by bf16_indexer_key_write)");
}

}  // namespace genbridge::ops
