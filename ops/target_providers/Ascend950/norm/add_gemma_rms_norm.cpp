// Ascend950 (A5) provider: composed as add_rms_norm(x, 1 + w, residual) with (1 + w) first
// materialised in w's dtype (rounded to nearest even).
#include "genbridge/ops/norm/add_gemma_rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status add_gemma_rms_norm(const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                          const TensorView& y, const TensorView& residual_sum) {
  return detail::run_add_norm_op(__func__, x, w, residual, eps, y, residual_sum, detail::NormWeight::kOnePlusRounded);
}

}  // namespace genbridge::ops
