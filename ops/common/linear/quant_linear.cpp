// Common to every target: W8A8 here, the MX schemes through the generation's kernels (mx_schemes.h);
// a generation without an MX data path answers Unimplemented for them, before any other check.
#include "genbridge/ops/linear/quant_linear.h"

#include "ops/common/linear/mx_schemes.h"
#include "ops/common/linear/quant_linear_kernel.h"

namespace genbridge::ops {

Status quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y) {
  return detail::run_quant_linear(x, w, y, detail::mx_schemes());
}

Status quantize_weight(const TensorView& w, const QuantWeight& out) {
  return detail::run_quantize_weight(w, out, detail::mx_schemes());
}

}  // namespace genbridge::ops
