#include "genbridge/ops/norm/rms_norm.h"

#include "ops/detail/norm/norm_kernel.h"

namespace genbridge::ops {

Status rms_norm(const TensorView& x, const TensorView& gamma, float eps, const TensorView& y,
                const TensorView& rstd) {
  detail::NormCall c;
  c.op = "rms_norm";
  c.weight_name = "gamma";
  c.x = x;
  c.weight = gamma;
  c.y = y;
  c.rstd = &rstd;
  c.eps = eps;
  return detail::run_norm(c);
}

}  // namespace genbridge::ops
