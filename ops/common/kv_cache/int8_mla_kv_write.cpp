#include "genbridge/ops/kv_cache/int8_mla_kv_write.h"

#include "ops/detail/kv_cache/mla_kv_write.h"

namespace genbridge::ops {

Status int8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                         const MlaKvCache& cache) {
  detail::MlaKvWriteCall c;
  c.op = "int8_mla_kv_write";
  c.slots = SlotMapping::kBlockOffsetPairs;
  c.format = MlaKvFormat::kInt8Fp16ScaleSplitRope;
  c.latent = latent;
  c.rope = rope;
  c.slot_mapping = slot_mapping;
  c.cache = cache;
  return detail::run_mla_kv_write(c);
}

}  // namespace genbridge::ops
