// activation/sigmoid_mul, one implementation for every target. The row loop is compiled once per CPU target
// (Highway, dispatched once per call); exp is the C library's expf per element, as in silu_and_mul, and each
// element's arithmetic stands alone, so every target, thread count and path gives the same bits.
#ifndef GENBRIDGE_OPS_COMMON_ACTIVATION_SIGMOID_MUL_SHARED_
#define GENBRIDGE_OPS_COMMON_ACTIVATION_SIGMOID_MUL_SHARED_
#include "genbridge/ops/activation/sigmoid_mul.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/activation/swiglu.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"
#endif  // GENBRIDGE_OPS_COMMON_ACTIVATION_SIGMOID_MUL_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/activation/sigmoid_mul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// out[i] = x[i] * (1 / (1 + exp(-gate[i]))): detail::sigmoid's steps, 16 lanes at a time. out may be x.
void SigmoidMulRow(const float* x, const float* gate, float* out, int64_t d) {
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    alignas(64) float e[kLanes];
    for (int l = 0; l < kLanes; ++l) e[l] = std::exp(-gate[i + l]);
    const V16 s = Set16(1.0f) / (Set16(1.0f) + Load16(static_cast<const float*>(e)));
    Store16(out + i, Load16(x + i) * s);
  }
  for (; i < d; ++i) out[i] = x[i] * sigmoid(gate[i]);
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {
HWY_EXPORT(SigmoidMulRow);
}  // namespace detail
namespace {

constexpr const char* kOp = "sigmoid_mul";

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data() != b.data() || a.dtype() != b.dtype() || a.rank() != b.rank()) return false;
  for (int d = 0; d < a.rank(); ++d) {
    if (a.dim(d) != b.dim(d) || (a.dim(d) > 1 && a.stride(d) != b.stride(d))) return false;
  }
  return true;
}

Status validate(const TensorView& x, const TensorView& gate, const TensorView& y) {
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "x", x));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "gate", gate));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "gate", gate, detail::shape_of(x), "(x's shape)"));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "y", y));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "y", y, detail::shape_of(x), "(x's shape)"));
  if (!same_view(y, x)) {
    if (Status st = detail::check_no_overlap(kOp, "y", y, "x", x); !st.ok()) {
      return invalid_argument("sigmoid_mul: y overlaps x in memory but is not x itself; y may alias x exactly "
                              "(in place) or not at all");
    }
  }
  return detail::check_no_overlap(kOp, "y", y, "gate", gate);
}

// A rank-0 view as one row of one element.
TensorView as_rows(const TensorView& t) { return t.rank() == 0 ? TensorView(t.data(), t.dtype(), {1}) : t; }

}  // namespace

Status sigmoid_mul(const TensorView& x_in, const TensorView& gate_in, const TensorView& y_in) {
  GB_RETURN_IF_ERROR(validate(x_in, gate_in, y_in));
  const TensorView x = as_rows(x_in), gate = as_rows(gate_in), y = as_rows(y_in);
  const int64_t d = x.dim(-1);
  const int64_t rows = d == 0 ? 0 : x.numel() / d;
  if (rows == 0) return ok_status();
  const auto row_kernel = GB_DISPATCH(detail::SigmoidMulRow);
  genbridge::detail::parallel_for(rows, 2 * d, [&](int64_t r0, int64_t r1) {
    std::vector<float> xs(static_cast<size_t>(d)), gs(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      detail::load_row_f32(x, 1, r, d, xs.data());
      detail::load_row_f32(gate, 1, r, d, gs.data());
      row_kernel(xs.data(), gs.data(), xs.data(), d);
      detail::store_row_f32(y, 1, r, d, xs.data());
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
