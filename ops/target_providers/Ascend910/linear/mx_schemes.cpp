// Ascend910 (A2/A3): W8A8 only (the generation's INT8 data path). The MX schemes are the explicit
// unsupported ones (docs/design.md#provider-staging): the generation has no FP8/FP4/E8M0 data path.
#include "ops/common/linear/mx_schemes.h"

namespace genbridge::ops::detail {

const MxSchemes& mx_schemes() {
  static constexpr MxSchemes kNone{.generation = "Ascend910 (A2/A3)",
                                   .offers = "w8a8 only; MX weights are an Ascend950 capability"};
  return kNone;
}

}  // namespace genbridge::ops::detail
