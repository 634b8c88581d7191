// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/kv_cache/bf16_mla_kv_write.h.
#include "genbridge/ops/kv_cache/bf16_mla_kv_write.h"

namespace genbridge::ops {

Status bf16_mla_kv_write(const TensorView&, const TensorView&, const TensorView&, const MlaKvCache&) {
  return unimplemented("bf16_mla_kv_write: not implemented yet");
}

}  // namespace genbridge::ops
