// Every generation has an INT8 data path, so the int8 MLA writer is common (block-offset slot pairs).
#include "genbridge/ops/kv_cache/int8_mla_kv_write.h"

#include "ops/common/kv_cache/mla_kv_write.h"

namespace genbridge::ops {

Status int8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                         const MlaKvCache& cache) {
  return detail::run_mla_kv_write({"int8_mla_kv_write", SlotMapping::kBlockOffsetPairs,
                                   MlaKvFormat::kInt8Fp16ScaleSplitRope, latent, rope, slot_mapping, cache});
}

}  // namespace genbridge::ops
