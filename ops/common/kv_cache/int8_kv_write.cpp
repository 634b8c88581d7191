// Every generation has an INT8 data path, so the int8 writer is common.
#include "genbridge/ops/kv_cache/int8_kv_write.h"

#include "ops/detail/kv_cache/kv_write.h"

namespace genbridge::ops {

Status int8_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                     const TensorView& key_cache, const TensorView& value_cache, const TensorView& key_scale_cache,
                     const TensorView& value_scale_cache) {
  detail::KvWriteCall c;
  c.op = "int8_kv_write";
  c.slots = SlotMapping::kBlockOffsetPairs;
  c.key = key;
  c.value = value;
  c.slot_mapping = slot_mapping;
  c.cache.format = KvCacheFormat::kInt8Fp16Scale;
  c.cache.key_cache = key_cache;
  c.cache.value_cache = value_cache;
  c.cache.key_scale_cache = key_scale_cache;
  c.cache.value_scale_cache = value_scale_cache;
  return detail::run_kv_write(c);
}

}  // namespace genbridge::ops
