// Ascend910 (A2/A3) provider: the explicit unsupported one (docs/design.md#provider-staging); the generation has no MX
// scale layout (docs/design.md#deviceoperator-contract).
#include "genbridge/ops/quant/normalize_mx_scale_layout.h"

namespace genbridge::ops {

Status normalize_mx_scale_layout(const TensorView&, const TensorView&) {
  return unimplemented(
      "normalize_mx_scale_layout is not supported on Ascend910 (A2/A3): the generation has no MX scale layout; "
      "MX scales are an Ascend950 capability");
}

}  // namespace genbridge::ops
