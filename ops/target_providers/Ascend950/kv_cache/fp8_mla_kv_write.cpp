// Ascend950 (A5) provider: the generation's quantized MLA KV cache, fp8 e4m3fn latent in tiles of 128 with
// fp32 scales and the bf16 rope packed in one row, addressed by flat slots.
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"

#include "ops/common/kv_cache/mla_kv_write.h"
#include "ops/target_providers/Ascend950/kv_cache/fp8_rows.h"

namespace genbridge::ops {

Status fp8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                        const MlaKvCache& cache) {
  return detail::run_mla_kv_write({"fp8_mla_kv_write", SlotMapping::kFlat, MlaKvFormat::kFp8TileScalePacked, latent,
                                   rope, slot_mapping, cache, detail::fp8_mla_row_encoder()});
}

}  // namespace genbridge::ops
