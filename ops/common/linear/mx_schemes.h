#pragma once
// Internal: this build's generation's MX weight schemes for linear/quant_linear (quant_linear_kernel.h's
// MxSchemes): its kernels, or none where it has no MX data path. The op is common; this is the
// generation's one difference, defined once per target tree (ops/target_providers/<Target>/linear/).

#include "ops/common/linear/quant_linear_kernel.h"

namespace genbridge::ops::detail {

const MxSchemes& mx_schemes();

}  // namespace genbridge::ops::detail
