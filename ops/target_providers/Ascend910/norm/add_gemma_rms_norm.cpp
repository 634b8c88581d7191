// Ascend910 (A2/A3) provider: fused add + native Gemma RMSNorm, (1 + w) formed in fp32.
#include "genbridge/ops/norm/add_gemma_rms_norm.h"

#include "ops/detail/norm/norm_kernel.h"

namespace genbridge::ops {

Status add_gemma_rms_norm(const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                          const TensorView& y, const TensorView& residual_sum) {
  detail::NormCall c;
  c.op = "add_gemma_rms_norm";
  c.weight_name = "w";
  c.x = x;
  c.weight = w;
  c.residual = &residual;
  c.y = y;
  c.residual_sum = &residual_sum;
  c.eps = eps;
  c.form = detail::WeightForm::kOnePlusInFp32;
  return detail::run_norm(c);
}

}  // namespace genbridge::ops
