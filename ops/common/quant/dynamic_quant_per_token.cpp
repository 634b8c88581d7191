// Common to every target: both generations have an int8 data path with fp32 per-token scales.
#include "genbridge/ops/quant/dynamic_quant_per_token.h"

#include "ops/common/quant/quant_kernel.h"

namespace genbridge::ops {

Status dynamic_quant_per_token(const TensorView& x, float eps, const TensorView& q, const TensorView& scale) {
  return detail::run_dynamic_quant_per_token(x, eps, q, scale);
}

}  // namespace genbridge::ops
