// Ascend910 (A2/A3) provider: the explicit unsupported one (docs/design.md#provider-staging); no FP8/FP4/E8M0 data
// path.
#include "genbridge/ops/quant/mx_dequant.h"

namespace genbridge::ops {

Status mx_dequant(const TensorView&, const TensorView&, int64_t, const TensorView&) {
  return unimplemented(
      "mx_dequant is not supported on Ascend910 (A2/A3): the generation has no FP8/FP4/E8M0 data path; "
      "MX dequantization is an Ascend950 capability");
}

}  // namespace genbridge::ops
