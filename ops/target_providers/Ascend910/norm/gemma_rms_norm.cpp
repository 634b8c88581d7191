// Ascend910 (A2/A3) provider: the generation has a native Gemma RMSNorm kernel, which forms
// (1 + w) in fp32 inside the kernel, without rounding it to w's dtype.
#include "genbridge/ops/norm/gemma_rms_norm.h"

#include "ops/detail/norm/norm_kernel.h"

namespace genbridge::ops {

Status gemma_rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                      const TensorView& rstd) {
  detail::NormCall c;
  c.op = "gemma_rms_norm";
  c.weight_name = "w";
  c.x = x;
  c.weight = w;
  c.y = y;
  c.rstd = &rstd;
  c.eps = eps;
  c.form = detail::WeightForm::kOnePlusInFp32;
  return detail::run_norm(c);
}

}  // namespace genbridge::ops
