#include "genbridge/ops/kv_cache/bf16_indexer_key_write.h"

#include "ops/detail/kv_cache/mla_kv_write.h"

namespace genbridge::ops {

Status bf16_indexer_key_write(const TensorView& key, const TensorView& slot_mapping, const IndexerKeyCache& cache) {
  detail::IndexerKeyWriteCall c;
  c.op = "bf16_indexer_key_write";
  c.slots = std::nullopt;
  c.format = IndexerKeyFormat::kBf16;
  c.key = key;
  c.slot_mapping = slot_mapping;
  c.cache = cache;
  return detail::run_indexer_key_write(c);
}

}  // namespace genbridge::ops
