// Ascend910 (A2/A3) provider: the explicit unsupported one (docs/design.md#provider-staging). The generation has no FP8
// data path; its quantized MLA KV cache is int8 latent + fp16 scale with a separate bf16 rope cache
// (kv_cache/int8_mla_kv_write).
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"

namespace genbridge::ops {

Status fp8_mla_kv_write(const TensorView&, const TensorView&, const TensorView&, const MlaKvCache&) {
  return unimplemented(
      "fp8_mla_kv_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its quantized MLA KV cache is "
      "int8 latent + fp16 scale with a separate bf16 rope cache, written by int8_mla_kv_write)");
}

}  // namespace genbridge::ops
