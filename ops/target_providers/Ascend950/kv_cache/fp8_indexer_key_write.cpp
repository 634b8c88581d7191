// Ascend950 (A5) provider: the generation's indexer keys, Hadamard-rotated fp8 e4m3fn with the fp32 scale
// packed at the row end, addressed by flat slots.
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"

#include "ops/detail/kv_cache/mla_kv_write.h"
#include "ops/target_providers/Ascend950/detail/kv_cache/fp8_mla_rows.h"

namespace genbridge::ops {

Status fp8_indexer_key_write(const TensorView& key, const TensorView& slot_mapping, const IndexerKeyCache& cache) {
  detail::IndexerKeyWriteCall c;
  c.op = "fp8_indexer_key_write";
  c.slots = SlotMapping::kFlat;
  c.format = IndexerKeyFormat::kFp8HadamardPackedScale;
  c.key = key;
  c.slot_mapping = slot_mapping;
  c.cache = cache;
  c.encode_row = detail::fp8_indexer_row_encoder();
  return detail::run_indexer_key_write(c);
}

}  // namespace genbridge::ops
