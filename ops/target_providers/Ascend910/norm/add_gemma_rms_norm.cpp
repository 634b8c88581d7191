// Ascend910 (A2/A3) provider: fused add + native Gemma RMSNorm, (1 + w) formed in fp32.
#include "genbridge/ops/norm/add_gemma_rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status add_gemma_rms_norm(const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                          const TensorView& y, const TensorView& residual_sum) {
  return detail::run_add_norm_op(__func__, x, w, residual, eps, y, residual_sum, detail::NormWeight::kOnePlusFp32);
}

}  // namespace genbridge::ops
