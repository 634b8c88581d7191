// Ascend950 (A5) provider: the generation's quantized MLA KV cache, fp8 e4m3fn latent in tiles of 128 with
// fp32 scales and the bf16 rope packed in one row, addressed by flat slots.
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"

#include "ops/detail/kv_cache/mla_kv_write.h"
#include "ops/target_providers/Ascend950/detail/kv_cache/fp8_mla_rows.h"

namespace genbridge::ops {

Status fp8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                        const MlaKvCache& cache) {
  detail::MlaKvWriteCall c;
  c.op = "fp8_mla_kv_write";
  c.slots = SlotMapping::kFlat;
  c.format = MlaKvFormat::kFp8TileScalePacked;
  c.latent = latent;
  c.rope = rope;
  c.slot_mapping = slot_mapping;
  c.cache = cache;
  c.encode_row = detail::fp8_mla_row_encoder();
  return detail::run_mla_kv_write(c);
}

}  // namespace genbridge::ops
