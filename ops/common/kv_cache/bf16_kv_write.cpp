#include "genbridge/ops/kv_cache/bf16_kv_write.h"

#include "ops/detail/kv_cache/kv_write.h"

namespace genbridge::ops {

Status bf16_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                     const TensorView& key_cache, const TensorView& value_cache) {
  detail::KvWriteCall c;
  c.op = "bf16_kv_write";
  c.slots = std::nullopt;
  c.key = key;
  c.value = value;
  c.slot_mapping = slot_mapping;
  c.cache.format = KvCacheFormat::kBf16;
  c.cache.key_cache = key_cache;
  c.cache.value_cache = value_cache;
  return detail::run_kv_write(c);
}

}  // namespace genbridge::ops
