// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/attention/mla_decode.h.
#include "genbridge/ops/attention/mla_decode.h"

namespace genbridge::ops {

Status mla_decode(const TensorView&, const TensorView&, const MlaKvCache&, const TensorView&, const TensorView&, const TensorView&, float, const TensorView&) {
  return unimplemented("mla_decode: not implemented yet");
}

}  // namespace genbridge::ops
