#pragma once
// Stable operator quant/mx_dequant (docs/design.md#stable-operator-contracts): the inverse of dynamic_mx_quant.

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// y[..., i] = fl32(decode(q[..., i]) * 2^(scale_j - 127)) rounded (nearest even) to y's dtype, where
// scale_j = scale[..., j / 2, j % 2] for block j = i / block_size. A 0xFF scale gives NaN for its block.
// q: fp8_e4m3fn or fp8_e5m2 [..., K], or fp4_e2m1x2 [..., K / 2]; scale: e8m0 in the pair layout
// [..., ceil(ceil(K / block_size) / 2), 2] (padding slot ignored); y: fp32/fp16/bf16 [..., K];
// block_size a multiple of 32 in [32, 1024]. Any strides. Writes y only (nothing on error); does not
// retain views. Needs an MX data path: a build for a generation without one returns Unimplemented.
Status mx_dequant(const TensorView& q, const TensorView& scale, int64_t block_size, const TensorView& y);

}  // namespace genbridge::ops
