#include "ops/common/norm/norm_call.h"

#include <cstdint>
#include <vector>

#include "ops/common/norm/norm_kernel.h"

namespace genbridge::ops::detail {

Status run_norm_op(const char* op, const TensorView& x, const TensorView& weight, const TensorView* residual, float eps,
                   const TensorView& y, const TensorView* rstd, const TensorView* residual_sum, NormWeight form) {
  NormCall c;
  c.op = op;
  c.weight_name = form == NormWeight::kGamma ? "gamma" : "w";
  c.x = x;
  c.weight = weight;
  c.residual = residual;
  c.y = y;
  c.residual_sum = residual_sum;
  c.rstd = rstd;
  c.eps = eps;
  c.form = form == NormWeight::kOnePlusFp32 ? WeightForm::kOnePlusInFp32 : WeightForm::kAsIs;
  if (form != NormWeight::kOnePlusRounded) return run_norm(c);
  // The composition: the Gemma op's checks, then the plain op (add_)rms_norm on the rounded weight.
  GB_RETURN_IF_ERROR(validate_norm(c));
  std::vector<uint32_t> storage;
  c.op = residual != nullptr ? "add_rms_norm" : "rms_norm";
  c.weight_name = "gamma";
  c.weight = offset_weight_rounded(weight, storage);
  return run_norm(c);
}

}  // namespace genbridge::ops::detail
