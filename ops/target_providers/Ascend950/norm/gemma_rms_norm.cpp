// Ascend950 (A5) provider: the generation has no native Gemma RMSNorm, so the op is composed as
// rms_norm(x, 1 + w) with (1 + w) first materialised in w's dtype (rounded to nearest even).
#include "genbridge/ops/norm/gemma_rms_norm.h"

#include "genbridge/ops/norm/rms_norm.h"
#include "ops/detail/norm/norm_kernel.h"

namespace genbridge::ops {

Status gemma_rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& y,
                      const TensorView& rstd) {
  detail::NormCall c;
  c.op = "gemma_rms_norm";
  c.weight_name = "w";
  c.x = x;
  c.weight = w;
  c.y = y;
  c.rstd = &rstd;
  c.eps = eps;
  GB_RETURN_IF_ERROR(detail::validate_norm(c));
  std::vector<uint32_t> storage;
  const TensorView one_plus_w = detail::offset_weight_rounded(w, storage);
  return rms_norm(x, one_plus_w, eps, y, rstd);
}

}  // namespace genbridge::ops
