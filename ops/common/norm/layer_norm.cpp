// Placeholder until the kernel lands (same commit series): the contract is in genbridge/ops/norm/layer_norm.h.
#include "genbridge/ops/norm/layer_norm.h"

namespace genbridge::ops {

Status layer_norm(const TensorView&, const TensorView&, const TensorView&, float, const TensorView&) {
  return unimplemented("layer_norm: not implemented yet");
}

}  // namespace genbridge::ops
