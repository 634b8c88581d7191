#pragma once
// The rows of a quantized MoE dispatch (DispatchRepresentation, runtime/device/device_operator.h): how the routed
// experts' input is quantized into them, read back from them and decoded, for the engine that sends them (an AFD
// attention rank, or the monolithic engine, which computes its routed experts from the same rows) and the one that
// computes from them (an FFN rank). One row of bytes per token, contiguous:
//   [codes: H elements of r.element | zero padding to a multiple of 4 | scales | zero padding to a multiple of 4]
// with scales fp32 [1] (int8 per token) or e8m0 [ceil(ceil(H / 32) / 2), 2] (MXFP8, the pair layout). The rows of
// a batch are back to back, so a run of tokens is one contiguous run of bytes (one message on the wire).

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "runtime/device/device_operator.h"

namespace genbridge::runtime {

// Byte offset of a row's scales, and bytes of one row, for rows of `hidden` elements.
int64_t dispatch_scale_offset(int64_t hidden);
int64_t dispatch_row_bytes(const DispatchRepresentation& r, int64_t hidden);

// Views of the codes (r.element [T, H]) and the scales (fp32 [T] or e8m0 [T, pairs, 2]) of `rows` (uint8 [T,
// dispatch_row_bytes(r, H)], rows back to back, 4-byte aligned). InvalidArgument naming the rule otherwise.
struct DispatchViews {
  TensorView codes;
  TensorView scales;
};
Result<DispatchViews> dispatch_views(const DispatchRepresentation& r, const TensorView& rows, int64_t hidden);

// Quantizes x (fp32 / bf16 [T, H], any strides) into `rows` (as above): int8 per token by
// quant/dynamic_quant_per_token (default eps), MXFP8 by quant/dynamic_mx_quant (block 32, fp8 e4m3fn,
// MxScaleAlg::kCeil); the padding bytes are written as zero. Writes rows only; does not retain any view.
Status quantize_dispatch(const DispatchRepresentation& r, const TensorView& x, const TensorView& rows);

// Decodes `rows` into y (fp32 [T, H], any strides): y = fl32(q * scale) (int8 per token) or quant/mx_dequant's
// values (MXFP8). Both are exact in fp32 for finite scales. Writes y only; does not retain any view.
Status dequantize_dispatch(const DispatchRepresentation& r, const TensorView& rows, const TensorView& y);

}  // namespace genbridge::runtime
