// Ascend910 (A2/A3) provider: the explicit unsupported one (docs/design.md#provider-staging). The generation has no FP8
// data path; its shared K = V rows stay bf16 (kv_cache/bf16_mla_kv_write) or int8 + fp16 scale
// (kv_cache/int8_mla_kv_write).
#include "genbridge/ops/kv_cache/mxfp8_mla_kv_write.h"

namespace genbridge::ops {

Status mxfp8_mla_kv_write(const TensorView&, const TensorView&, const TensorView&, const MlaKvCache&) {
  return unimplemented(
      "mxfp8_mla_kv_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its KV rows are bf16, written by "
      "bf16_mla_kv_write, or int8 + fp16 scale, written by int8_mla_kv_write)");
}

}  // namespace genbridge::ops
