#pragma once
// Error bounds for checking fp32 kernels against fp64 oracles. A bound that a correct kernel can never
// exceed, and that a wrong reduction (a dropped or doubled term, a wrong row) exceeds by far.

#include <cmath>
#include <cstdint>

#include "genbridge/core/dtype.h"

namespace genbridge::testing {

// |fp32 dot - exact| for the kernels' order over K terms (16-lane fused multiply-add chains of
// ceil(K/16) steps, a 4-level lane reduction, one optional bias add) whose magnitudes sum to abs_sum.
inline double dot_error_bound(int64_t K, double abs_sum) {
  const double steps = static_cast<double>((K + 15) / 16) + 6.0;
  return 1.01 * steps * 0x1p-24 * abs_sum;
}

// Error of rounding an fp32 value v once more to `d` (RNE): half an ulp, plus fp16's subnormal spacing.
inline double rounding_bound(DType d, double v) {
  switch (d) {
    case DType::kBF16: return 0x1p-8 * std::abs(v) + 0x1p-133;
    case DType::kF16: return 0x1p-11 * std::abs(v) + 0x1p-25;
    default: return 0.0;
  }
}

}  // namespace genbridge::testing
