#include "genbridge/ops/kv_cache/bf16_indexer_key_write.h"

#include "ops/common/kv_cache/mla_kv_write.h"

namespace genbridge::ops {

Status bf16_indexer_key_write(const TensorView& key, const TensorView& slot_mapping, const IndexerKeyCache& cache) {
  return detail::run_indexer_key_write(
      {"bf16_indexer_key_write", std::nullopt, IndexerKeyFormat::kBf16, key, slot_mapping, cache});
}

}  // namespace genbridge::ops
