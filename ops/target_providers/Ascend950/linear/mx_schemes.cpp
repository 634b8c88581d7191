// Ascend950 (A5): MXFP8 and MXFP4 (the generation's MX data path, scales in the pair layout read in place)
// besides W8A8 (A5 keeps the INT8 data path).
#include "ops/common/linear/mx_schemes.h"

#include "ops/target_providers/Ascend950/linear/mx_linear_kernel.h"

namespace genbridge::ops::detail {

const MxSchemes& mx_schemes() {
  static constexpr MxSchemes kMx{.linear = run_mx_linear, .quantize_weight = run_mx_quantize_weight};
  return kMx;
}

}  // namespace genbridge::ops::detail
