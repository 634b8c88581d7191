#pragma once
// Internal: host kernels behind the quant/* stable operators. Generic: no target knowledge; a provider
// that implements an op on its generation calls these, one that cannot returns Unimplemented itself.
// Every run_* validates all arguments first (InvalidArgument naming op, value and rule) and writes
// nothing unless they are all valid. Work is split over rows, so results never depend on the thread count.

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/quant/dynamic_mx_quant.h"

namespace genbridge::ops::detail {

Status run_dynamic_quant_per_token(const TensorView& x, float eps, const TensorView& q, const TensorView& scale);
Status run_dynamic_mx_quant(const TensorView& x, const MxQuantConfig& config, const TensorView& q,
                            const TensorView& scale);
Status run_mx_dequant(const TensorView& q, const TensorView& scale, int64_t block_size, const TensorView& y);
Status run_normalize_mx_scale_layout(const TensorView& scale, const TensorView& out);

// e8m0 byte of a block whose amax has the fp32 bit pattern `amax_bits` (sign bit clear; NaN or inf
// patterns give 0xFF). `dst` is an MX element dtype.
uint8_t mx_scale_code(uint32_t amax_bits, DType dst, MxScaleAlg alg, bool round_scale);

}  // namespace genbridge::ops::detail
