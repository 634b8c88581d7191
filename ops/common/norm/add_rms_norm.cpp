#include "genbridge/ops/norm/add_rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status add_rms_norm(const TensorView& x, const TensorView& gamma, const TensorView& residual, float eps,
                    const TensorView& y, const TensorView& residual_sum) {
  return detail::run_add_norm_op(__func__, x, gamma, residual, eps, y, residual_sum, detail::NormWeight::kGamma);
}

}  // namespace genbridge::ops
