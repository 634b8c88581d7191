#include "ops/common/moe/routing_checks.h"

#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops::detail {

Status check_rows_and_topk_ids(const char* op, const char* name, const TensorView& x, const char* layout,
                               const TensorView& ids, int64_t& T, int64_t& C, int64_t& k) {
  GB_RETURN_IF_ERROR(check_float_tensor(op, name, x));
  GB_RETURN_IF_ERROR(check_rank(op, name, x, 2, layout));
  T = x.dim(0);
  C = x.dim(1);
  GB_RETURN_IF_ERROR(check_dtype(op, "topk_ids", ids, DType::kI32));
  GB_RETURN_IF_ERROR(check_rank(op, "topk_ids", ids, 2, "([T, k])"));
  k = ids.dim(1);
  return ok_status();
}

Status check_swiglu_limit(const char* op, float limit) {
  if (limit > 0.0f) return ok_status();  // false for NaN
  return invalid_argument(s(op) + ": swiglu_limit is " + f(limit) + " but must be > 0 (+inf: no clamp)");
}

Status check_router_outputs(const char* op, const TensorView& logits, const TensorView& ids, const TensorView& weights,
                            int64_t T, int64_t k) {
  GB_RETURN_IF_ERROR(check_shape(op, "topk_ids", ids, {T, k}, "([T, k] with T = logits' rows)"));
  GB_RETURN_IF_ERROR(check_dtype(op, "topk_weights", weights, DType::kF32));
  GB_RETURN_IF_ERROR(check_shape(op, "topk_weights", weights, {T, k}, "([T, k] like topk_ids)"));
  GB_RETURN_IF_ERROR(check_no_overlap(op, "topk_ids", ids, "logits", logits));
  return check_no_overlap(op, "topk_weights", weights, "logits", logits);
}

}  // namespace genbridge::ops::detail
