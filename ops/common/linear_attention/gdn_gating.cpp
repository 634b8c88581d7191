// linear_attention/gdn_gating, one implementation for every target. Every element is a few C library calls
// (expf, log1pf) and one or two fp32 operations of its own, in the contract's order: the same bits on every
// CPU target and thread count (there is nothing for vectors to share across elements).
#include "genbridge/ops/linear_attention/gdn_gating.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "ops/common/activation/swiglu.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"

namespace genbridge::ops {
namespace {

constexpr const char* kOp = "gdn_gating";

Status validate(const TensorView& a, const TensorView& b, const TensorView& A_log, const TensorView& dt_bias,
                const TensorView& g, const TensorView& beta) {
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "a", a));
  GB_RETURN_IF_ERROR(detail::check_rank(kOp, "a", a, 2, "[T, nv]"));
  const std::vector<int64_t> shape = detail::shape_of(a);
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "b", b));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "b", b, shape, "(a's shape [T, nv])"));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "A_log", A_log));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "A_log", A_log, {shape[1]}, "([nv], a's last dimension)"));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "dt_bias", dt_bias));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "dt_bias", dt_bias, {shape[1]}, "([nv], a's last dimension)"));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "g", g, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "g", g, shape, "(a's shape [T, nv])"));
  GB_RETURN_IF_ERROR(detail::check_dtype(kOp, "beta", beta, DType::kF32));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "beta", beta, shape, "(a's shape [T, nv])"));
  for (const auto& [name, in] : {std::pair<const char*, const TensorView*>{"a", &a}, {"b", &b}, {"A_log", &A_log},
                                 {"dt_bias", &dt_bias}}) {
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "g", g, name, *in));
    GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "beta", beta, name, *in));
  }
  return detail::check_no_overlap(kOp, "beta", beta, "g", g);
}

}  // namespace

Status gdn_gating(const TensorView& a, const TensorView& b, const TensorView& A_log, const TensorView& dt_bias,
                  const TensorView& g, const TensorView& beta) {
  GB_RETURN_IF_ERROR(validate(a, b, A_log, dt_bias, g, beta));
  const int64_t T = a.dim(0), nv = a.dim(1);
  if (T == 0 || nv == 0) return ok_status();
  std::vector<float> neg_a(static_cast<size_t>(nv)), bias(static_cast<size_t>(nv));
  detail::load_row_f32(A_log, 1, 0, nv, neg_a.data());
  detail::load_row_f32(dt_bias, 1, 0, nv, bias.data());
  for (float& v : neg_a) v = -std::exp(v);  // -expf(A_log): the sign flip is exact
  genbridge::detail::parallel_for(T, 8 * nv, [&](int64_t t0, int64_t t1) {
    std::vector<float> ar(static_cast<size_t>(nv)), br(static_cast<size_t>(nv));
    for (int64_t t = t0; t < t1; ++t) {
      detail::load_row_f32(a, 1, t, nv, ar.data());
      detail::load_row_f32(b, 1, t, nv, br.data());
      for (int64_t h = 0; h < nv; ++h) {
        const float v = ar[h] + bias[h];
        ar[h] = neg_a[h] * detail::softplus(v);
        br[h] = detail::sigmoid(br[h]);
      }
      detail::store_row_f32(g, 1, t, nv, ar.data());
      detail::store_row_f32(beta, 1, t, nv, br.data());
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
