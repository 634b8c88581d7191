#include "genbridge/ops/norm/rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status rms_norm(const TensorView& x, const TensorView& gamma, float eps, const TensorView& y, const TensorView& rstd) {
  return detail::run_norm_op("rms_norm", x, gamma, nullptr, eps, y, &rstd, nullptr, detail::NormWeight::kGamma);
}

}  // namespace genbridge::ops
