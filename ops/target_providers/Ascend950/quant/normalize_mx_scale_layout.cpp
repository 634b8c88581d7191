// Ascend950 (A5) provider: the generation's MX matmuls read block scales in the pair layout
// [..., K/64, 2]; this converts a flat [M, K/32] scale tensor into it.
#include "genbridge/ops/quant/normalize_mx_scale_layout.h"

#include "ops/target_providers/Ascend950/quant/mx_kernel.h"

namespace genbridge::ops {

Status normalize_mx_scale_layout(const TensorView& scale, const TensorView& out) {
  return detail::run_normalize_mx_scale_layout(scale, out);
}

}  // namespace genbridge::ops
