#pragma once
// Stable operator quant/normalize_mx_scale_layout (docs/design.md#stable-operator-contracts, #deviceoperator-contract):
// converts a flat per-block MX scale tensor into the pair layout the generation's matmuls read.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// out[m, j, t] = scale[m, 2j + t] where 2j + t < N, else 0 (the padding byte of an odd N).
// scale: e8m0 [M, N] (N = ceil(K / 32) for 32-element blocks), any strides; out: e8m0
// [M, ceil(N / 2), 2], any strides, not overlapping scale. Writes out only (nothing on error); does not
// retain views. Needs an MX data path: a build for a generation without one returns Unimplemented.
Status normalize_mx_scale_layout(const TensorView& scale, const TensorView& out);

}  // namespace genbridge::ops
