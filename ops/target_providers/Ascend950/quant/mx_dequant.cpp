// Ascend950 (A5) provider: decodes MXFP8/MXFP4 blocks with their e8m0 scales.
#include "genbridge/ops/quant/mx_dequant.h"

#include "ops/target_providers/Ascend950/quant/mx_kernel.h"

namespace genbridge::ops {

Status mx_dequant(const TensorView& q, const TensorView& scale, int64_t block_size, const TensorView& y) {
  return detail::run_mx_dequant(q, scale, block_size, y);
}

}  // namespace genbridge::ops
