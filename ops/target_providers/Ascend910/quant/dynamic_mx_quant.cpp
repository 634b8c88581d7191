// Ascend910 (A2/A3) provider: the explicit unsupported one (docs/design.md#provider-staging). The generation has no
// FP8, FP4 or E8M0 data path, so there is nothing to quantize into; the DeviceOperator never routes MX work here.
#include "genbridge/ops/quant/dynamic_mx_quant.h"

namespace genbridge::ops {

Status dynamic_mx_quant(const TensorView&, const MxQuantConfig&, const TensorView&, const TensorView&) {
  return unimplemented(
      "dynamic_mx_quant is not supported on Ascend910 (A2/A3): the generation has no FP8/FP4/E8M0 data path; "
      "MX quantization is an Ascend950 capability");
}

}  // namespace genbridge::ops
