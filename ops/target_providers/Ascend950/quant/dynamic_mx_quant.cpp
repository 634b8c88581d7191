// Ascend950 (A5) provider: the generation has an MXFP8/MXFP4 data path with e8m0 block scales, so
// MX quantization runs natively (host kernel reproducing its numerics bit for bit).
#include "genbridge/ops/quant/dynamic_mx_quant.h"

#include "ops/target_providers/Ascend950/quant/mx_kernel.h"

namespace genbridge::ops {

Status dynamic_mx_quant(const TensorView& x, const MxQuantConfig& config, const TensorView& q, const TensorView& scale) {
  return detail::run_dynamic_mx_quant(x, config, q, scale);
}

}  // namespace genbridge::ops
