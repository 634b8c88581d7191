// Ascend950 (A5) provider: composed as add_rms_norm(x, 1 + w, residual) with (1 + w) first
// materialised in w's dtype (rounded to nearest even).
#include "genbridge/ops/norm/add_gemma_rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status add_gemma_rms_norm(const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                          const TensorView& y, const TensorView& residual_sum) {
  return detail::run_norm_op("add_gemma_rms_norm", x, w, &residual, eps, y, nullptr, &residual_sum,
                             detail::NormWeight::kOnePlusRounded);
}

}  // namespace genbridge::ops
