#pragma once
// Internal: the row kernel behind norm/layer_norm. Generic.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops::detail {

// Validates (InvalidArgument naming layer_norm, the value and the rule) and computes y (the contract of
// norm/layer_norm). Rows in parallel, each computed the same way on any thread and CPU target.
Status run_layer_norm(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                      const TensorView& y);

}  // namespace genbridge::ops::detail
