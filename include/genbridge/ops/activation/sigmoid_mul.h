#pragma once
// Stable operator activation/sigmoid_mul: an output gate, y = x * sigmoid(gate) (Qwen3.5 gated attention).

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// y = x * (1 / (1 + expf(-gate))) elementwise, in fp32, rounded once (RNE) to y's dtype. x, gate, y: the
// same shape, fp32/bf16, any strides (gate may be a view into a wider row, e.g. Qwen3.5's [q | gate] head
// rows); y may alias x exactly (in place) but must not partially overlap x or gate. Validates everything
// before writing; does not retain views.
Status sigmoid_mul(const TensorView& x, const TensorView& gate, const TensorView& y);

}  // namespace genbridge::ops
