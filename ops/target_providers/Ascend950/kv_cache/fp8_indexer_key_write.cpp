// Ascend950 (A5) provider: the generation's indexer keys, Hadamard-rotated fp8 e4m3fn with the fp32 scale
// packed at the row end, addressed by flat slots.
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"

#include "ops/common/kv_cache/mla_kv_write.h"
#include "ops/target_providers/Ascend950/kv_cache/fp8_rows.h"

namespace genbridge::ops {

Status fp8_indexer_key_write(const TensorView& key, const TensorView& slot_mapping, const IndexerKeyCache& cache) {
  return detail::run_indexer_key_write({"fp8_indexer_key_write", SlotMapping::kFlat,
                                        IndexerKeyFormat::kFp8HadamardPackedScale, key, slot_mapping, cache,
                                        detail::fp8_indexer_row_encoder()});
}

}  // namespace genbridge::ops
