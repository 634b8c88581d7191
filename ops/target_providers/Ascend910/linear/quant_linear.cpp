// Ascend910 (A2/A3) provider of linear/quant_linear: W8A8 (the generation's INT8 data path). The MX
// schemes are the explicit unsupported ones (docs/design.md#provider-staging): the generation has no FP8/FP4/E8M0 data
// path.
#include "genbridge/ops/linear/quant_linear.h"

#include "ops/detail/linear/quant_linear_kernel.h"

namespace genbridge::ops {
namespace {

constexpr const char* kGeneration = "Ascend910 (A2/A3)";
constexpr const char* kOffers = "w8a8 only; MX weights are an Ascend950 capability";

}  // namespace

Status quant_linear(const TensorView& x, const QuantWeight& w, const TensorView& y) {
  if (w.scheme == WeightQuantScheme::kMxfp8 || w.scheme == WeightQuantScheme::kMxfp4) {
    return detail::quant_scheme_unimplemented("quant_linear", w.scheme, kGeneration, kOffers);
  }
  int64_t M = 0, N = 0, K = 0;
  GB_RETURN_IF_ERROR(detail::check_quant_linear(x, w, y, M, N, K));
  if (M == 0 || N == 0) return ok_status();
  if (K == 0) {
    detail::store_zero_rows(y, M, N);
    return ok_status();
  }
  detail::run_w8a8_linear(x, w, y, M, N, K);
  return ok_status();
}

Status quantize_weight(const TensorView& w, const QuantWeight& out) {
  if (out.scheme == WeightQuantScheme::kMxfp8 || out.scheme == WeightQuantScheme::kMxfp4) {
    return detail::quant_scheme_unimplemented("quantize_weight", out.scheme, kGeneration, kOffers);
  }
  int64_t N = 0, K = 0;
  GB_RETURN_IF_ERROR(detail::check_quantize_weight(w, out, N, K));
  return detail::run_w8a8_quantize_weight(w, out);
}

}  // namespace genbridge::ops
