// Ascend950 (A5) provider of linear/quant_linear: MXFP8 and MXFP4 (the generation's MX data path, scales
// in the pair layout read in place) and W8A8 (A5 keeps the INT8 data path).
#include "genbridge/ops/linear/quant_linear.h"

#include "ops/detail/linear/quant_linear_kernel.h"
#include "ops/target_providers/Ascend950/detail/linear/mx_linear_kernel.h"

namespace genbridge::ops {

Status quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y) {
  int64_t M = 0, N = 0, K = 0;
  GB_RETURN_IF_ERROR(detail::check_quant_linear(x, w, y, M, N, K));
  if (M == 0 || N == 0) return ok_status();
  if (K == 0) {
    detail::store_zero_rows(y, M, N);
    return ok_status();
  }
  if (w.scheme == WeightQuantScheme::kW8A8) {
    detail::run_w8a8_linear(x, w, y, M, N, K);
  } else {
    detail::run_mx_linear(x, w, y, M, N, K);
  }
  return ok_status();
}

Status quantize_weight(const TensorView& w, const QuantWeight& out) {
  int64_t N = 0, K = 0;
  GB_RETURN_IF_ERROR(detail::check_quantize_weight(w, out, N, K));
  if (out.scheme == WeightQuantScheme::kW8A8) return detail::run_w8a8_quantize_weight(w, out);
  return detail::run_mx_quantize_weight(w, out);
}

}  // namespace genbridge::ops
