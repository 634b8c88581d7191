#include "genbridge/ops/norm/add_rms_norm.h"

#include "ops/detail/norm/norm_kernel.h"

namespace genbridge::ops {

Status add_rms_norm(const TensorView& x, const TensorView& gamma, const TensorView& residual, float eps,
                    const TensorView& y, const TensorView& residual_sum) {
  detail::NormCall c;
  c.op = "add_rms_norm";
  c.weight_name = "gamma";
  c.x = x;
  c.weight = gamma;
  c.residual = &residual;
  c.y = y;
  c.residual_sum = &residual_sum;
  c.eps = eps;
  return detail::run_norm(c);
}

}  // namespace genbridge::ops
