// Ascend950 (A5) provider: composed as add_rms_norm(x, 1 + w, residual) with (1 + w) first
// materialised in w's dtype (rounded to nearest even).
#include "genbridge/ops/norm/add_gemma_rms_norm.h"

#include "genbridge/ops/norm/add_rms_norm.h"
#include "ops/detail/norm/norm_kernel.h"

namespace genbridge::ops {

Status add_gemma_rms_norm(const TensorView& x, const TensorView& w, const TensorView& residual, float eps,
                          const TensorView& y, const TensorView& residual_sum) {
  detail::NormCall c;
  c.op = "add_gemma_rms_norm";
  c.weight_name = "w";
  c.x = x;
  c.weight = w;
  c.residual = &residual;
  c.y = y;
  c.residual_sum = &residual_sum;
  c.eps = eps;
  GB_RETURN_IF_ERROR(detail::validate_norm(c));
  std::vector<uint32_t> storage;
  const TensorView one_plus_w = detail::offset_weight_rounded(w, storage);
  return add_rms_norm(x, one_plus_w, residual, eps, y, residual_sum);
}

}  // namespace genbridge::ops
