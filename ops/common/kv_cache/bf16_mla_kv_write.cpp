#include "genbridge/ops/kv_cache/bf16_mla_kv_write.h"

#include "ops/common/kv_cache/mla_kv_write.h"

namespace genbridge::ops {

Status bf16_mla_kv_write(const TensorView& latent, const TensorView& rope, const TensorView& slot_mapping,
                         const MlaKvCache& cache) {
  return detail::run_mla_kv_write(
      {"bf16_mla_kv_write", std::nullopt, MlaKvFormat::kBf16, latent, rope, slot_mapping, cache});
}

}  // namespace genbridge::ops
