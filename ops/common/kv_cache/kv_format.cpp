// The dimension rules of the representation table (kv_cache/kv_format.h; the table itself is constexpr
// data in the header, so compile-time row sizes come from it too). The rules live beside the cache checks
// that also apply them (ops/common/kv_cache/kv_layout.h).
#include "genbridge/ops/kv_cache/kv_format.h"

#include "ops/common/kv_cache/kv_layout.h"

namespace genbridge::ops {

Status check_mla_kv_dims(MlaKvFormat f, int64_t kv_lora_rank, int64_t rope_dim) {
  return detail::check_mla_dims(f, kv_lora_rank, rope_dim);
}

Status check_indexer_key_dims(IndexerKeyFormat f, int64_t index_head_dim) {
  return detail::check_indexer_dims(f, index_head_dim);
}

}  // namespace genbridge::ops
