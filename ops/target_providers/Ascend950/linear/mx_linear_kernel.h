#pragma once
// Internal: linear/quant_linear's MX schemes (MXFP8, MXFP4 weights with e8m0 scales per 32 along K in the
// pair layout). Private to this generation's providers (the MX data path is this generation's).

#include <cstdint>

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"
#include "genbridge/ops/linear/quant_linear.h"

namespace genbridge::ops::detail {

// quant_linear for kMxfp8 / kMxfp4 (arguments already checked, M, N, K > 0): each weight element is decoded
// to fp32 exactly as the contract says (fl32(element * 2^(s - 127)), reading the pair-layout scales in
// place) and reduced against fp32 x rows in the order of linear's batch-invariant dot kernel (dot_kernel.h):
// up to mx_fused_max_rows rows (mx_dot_kernel.h; per CPU target): decoded in registers inside the GEMV; more:
// decoded into the GEMM's packed weight panels (gemm_chunks_fn). Every row's bits are those of linear/linear with the
// decoded fp32 weight.
void run_mx_linear(const TensorView& x, const QuantWeight& w, const TensorView& y, int64_t M, int64_t N, int64_t K);

// quantize_weight for kMxfp8 / kMxfp4 (arguments already checked): dynamic_mx_quant with the scheme's
// scale rule, writing the pair-layout scales directly.
Status run_mx_quantize_weight(const TensorView& w, const QuantWeight& out);

}  // namespace genbridge::ops::detail
