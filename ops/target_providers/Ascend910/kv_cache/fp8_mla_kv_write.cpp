// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/kv_cache/fp8_mla_kv_write.h.
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"

namespace genbridge::ops {

Status fp8_mla_kv_write(const TensorView&, const TensorView&, const TensorView&, const MlaKvCache&) {
  return unimplemented("fp8_mla_kv_write: not implemented yet");
}

}  // namespace genbridge::ops
