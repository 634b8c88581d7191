#include "genbridge/ops/norm/layer_norm.h"

#include "ops/common/norm/layer_norm_kernel.h"

namespace genbridge::ops {

Status layer_norm(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                  const TensorView& y) {
  return detail::run_layer_norm(x, gamma, beta, eps, y);
}

}  // namespace genbridge::ops
