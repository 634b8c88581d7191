#pragma once
// Internal: the shared host kernels behind the quant/* stable operators (the MX kernels, which one
// generation uses, live under that generation's ops/target_providers/<Target>/quant/). Generic: no
// target knowledge; a provider that implements an op on its generation calls these, one that cannot
// returns Unimplemented itself.
// Every run_* validates all arguments first (InvalidArgument naming op, value and rule) and writes
// nothing unless they are all valid. Work is split over rows, so results never depend on the thread count.

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

Status run_dynamic_quant_per_token(const TensorView& x, float eps, const TensorView& q, const TensorView& scale);

}  // namespace genbridge::ops::detail
