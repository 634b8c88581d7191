// Ascend950 (A5) provider: the generation has an FP8 data path; its quantized KV cache is fp8 e4m3fn
// with the fp32 scale packed at the end of each row, addressed by flat slots.
#include "genbridge/ops/kv_cache/fp8_kv_write.h"

#include "ops/common/kv_cache/kv_write.h"
#include "ops/target_providers/Ascend950/kv_cache/fp8_rows.h"

namespace genbridge::ops {

Status fp8_kv_write(const TensorView& key, const TensorView& value, const TensorView& slot_mapping,
                    const TensorView& key_cache, const TensorView& value_cache) {
  const PagedKvCache cache{KvCacheFormat::kFp8Fp32PackedScale, key_cache, value_cache};
  return detail::run_kv_write(
      {"fp8_kv_write", SlotMapping::kFlat, key, value, slot_mapping, cache, detail::fp8_kv_row_encoder()});
}

}  // namespace genbridge::ops
