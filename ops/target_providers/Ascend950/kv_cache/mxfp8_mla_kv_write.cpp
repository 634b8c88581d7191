// Ascend950 (A5) provider: the generation's MXFP8 row of DeepSeek-V4's shared K = V cache: bf16 rope first,
// fp8 e4m3fn latent codes with one E8M0 scale per 64, padded to 128 bytes, addressed by flat slots.
#include "genbridge/ops/kv_cache/mxfp8_mla_kv_write.h"

#include "ops/common/kv_cache/mla_kv_write.h"
#include "ops/target_providers/Ascend950/kv_cache/fp8_rows.h"

namespace genbridge::ops {

Status mxfp8_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                          const MlaKvCache& cache) {
  return detail::run_mla_kv_write({"mxfp8_mla_kv_write", SlotMapping::kFlat, MlaKvFormat::kMxfp8RopeFirstPacked,
                                   latent, rope, slot_mapping, cache, detail::mxfp8_mla_row_encoder()});
}

}  // namespace genbridge::ops
