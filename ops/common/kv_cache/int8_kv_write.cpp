// Every generation has an INT8 data path, so the int8 writer is common.
#include "genbridge/ops/kv_cache/int8_kv_write.h"

#include "ops/common/kv_cache/kv_write.h"

namespace genbridge::ops {

Status int8_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                     const TensorView& key_cache, const TensorView& value_cache, const TensorView& key_scale_cache,
                     const TensorView& value_scale_cache) {
  const PagedKvCache cache{KvCacheFormat::kInt8Fp16Scale, key_cache, value_cache, key_scale_cache, value_scale_cache};
  return detail::run_kv_write({"int8_kv_write", SlotMapping::kBlockOffsetPairs, key, value, slot_mapping, cache});
}

}  // namespace genbridge::ops
