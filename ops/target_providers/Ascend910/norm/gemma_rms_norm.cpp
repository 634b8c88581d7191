// Ascend910 (A2/A3) provider: the generation has a native Gemma RMSNorm kernel, which forms
// (1 + w) in fp32 inside the kernel, without rounding it to w's dtype.
#include "genbridge/ops/norm/gemma_rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status gemma_rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                      const TensorView& rstd) {
  return detail::run_norm_op("gemma_rms_norm", x, w, nullptr, eps, y, &rstd, nullptr, detail::NormWeight::kOnePlusFp32);
}

}  // namespace genbridge::ops
