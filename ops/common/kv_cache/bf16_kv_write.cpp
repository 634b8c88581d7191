#include "genbridge/ops/kv_cache/bf16_kv_write.h"

#include "ops/common/kv_cache/kv_write.h"

namespace genbridge::ops {

Status bf16_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                     const TensorView& key_cache, const TensorView& value_cache) {
  return detail::run_kv_write(
      {"bf16_kv_write", std::nullopt, key, value, slot_mapping, {KvCacheFormat::kBf16, key_cache, value_cache}});
}

}  // namespace genbridge::ops
