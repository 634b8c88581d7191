// Ascend950 (A5) provider: the generation has an FP8 data path; its quantized KV cache is fp8 e4m3fn
// with the fp32 scale packed at the end of each row, addressed by flat slots.
#include "genbridge/ops/kv_cache/fp8_kv_write.h"

#include "ops/detail/kv_cache/kv_write.h"
#include "ops/target_providers/Ascend950/detail/kv_cache/fp8_kv_row.h"

namespace genbridge::ops {

Status fp8_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                    const TensorView& key_cache, const TensorView& value_cache) {
  detail::KvWriteCall c;
  c.op = "fp8_kv_write";
  c.slots = SlotMapping::kFlat;
  c.key = key;
  c.value = value;
  c.slot_mapping = slot_mapping;
  c.cache.format = KvCacheFormat::kFp8Fp32PackedScale;
  c.cache.key_cache = key_cache;
  c.cache.value_cache = value_cache;
  c.encode_row = detail::fp8_kv_row_encoder();
  return detail::run_kv_write(c);
}

}  // namespace genbridge::ops
