#pragma once
// Internal: the one call every norm/* RMS entry makes. The Gemma ops' weight is an offset,
// y = x * rsqrt(mean(x^2) + eps) * (1 + w), and the generations form (1 + w) differently
// (docs/design.md#stable-operator-contracts): each Gemma provider passes its form.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

enum class NormWeight {
  kGamma,           // the weight as given ("gamma")
  kOnePlusFp32,     // "w", a native Gemma kernel: 1 + w formed in fp32 inside the kernel
  kOnePlusRounded,  // "w", a composition: 1 + w first rounded to w's dtype (RNE), then the plain norm
};

// Plain ops pass rstd (residual and residual_sum null), fused-add ones residual and residual_sum (rstd
// null). Validates every argument as `op` before computing anything.
Status run_norm_op(const char* op, const TensorView& x, const TensorView& weight, const TensorView* residual, float eps,
                   const TensorView& y, const TensorView* rstd, const TensorView* residual_sum, NormWeight form);

// The fused-add ops' call: y = norm(x + residual) * weight and residual_sum = x + residual. An entry passes
// __func__ as `op` (the entry is named as its operator).
inline Status run_add_norm_op(const char* op, const TensorView& x, const TensorView& weight, const TensorView& residual,
                              float eps, const TensorView& y, const TensorView& residual_sum, NormWeight form) {
  return run_norm_op(op, x, weight, &residual, eps, y, nullptr, &residual_sum, form);
}

}  // namespace genbridge::ops::detail
