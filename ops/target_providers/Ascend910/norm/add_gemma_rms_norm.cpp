// Ascend910 (A2/A3) provider: fused add + native Gemma RMSNorm, (1 + w) formed in fp32.
#include "genbridge/ops/norm/add_gemma_rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status add_gemma_rms_norm(const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                          const TensorView& y, const TensorView& residual_sum) {
  return detail::run_norm_op("add_gemma_rms_norm", x, w, &residual, eps, y, nullptr, &residual_sum,
                             detail::NormWeight::kOnePlusFp32);
}

}  // namespace genbridge::ops
