// Ascend910 (A2/A3) provider: the explicit unsupported one (docs/design.md#provider-staging). The generation has no FP8
// data path; its quantized KV cache is int8 with fp16 scales (kv_cache/int8_kv_write).
#include "genbridge/ops/kv_cache/fp8_kv_write.h"

namespace genbridge::ops {

Status fp8_kv_write(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&) {
  return unimplemented(
      "fp8_kv_write is not supported on Ascend910 (A2/A3 has no FP8 data path; its quantized KV cache is int8 "
      "with fp16 scales, written by int8_kv_write)");
}

}  // namespace genbridge::ops
