// Ascend950 (A5) provider: the generation has no native Gemma RMSNorm, so the op is composed as
// rms_norm(x, 1 + w) with (1 + w) first materialised in w's dtype (rounded to nearest even).
#include "genbridge/ops/norm/gemma_rms_norm.h"

#include "ops/common/norm/norm_call.h"

namespace genbridge::ops {

Status gemma_rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                      const TensorView& rstd) {
  return detail::run_norm_op("gemma_rms_norm", x, w, nullptr, eps, y, &rstd, nullptr,
                             detail::NormWeight::kOnePlusRounded);
}

}  // namespace genbridge::ops
