// norm/gated_rms_norm, one implementation for every target. The row kernel is compiled once per CPU target
// (Highway, dispatched once per call): the sum of squares in the contract's 16-lane order (core/simd/vec16-inl.h),
// exp from the C library per element, so every target and thread count gives the same bits.
#ifndef GENBRIDGE_OPS_COMMON_NORM_GATED_RMS_NORM_SHARED_
#define GENBRIDGE_OPS_COMMON_NORM_GATED_RMS_NORM_SHARED_
#include "genbridge/ops/norm/gated_rms_norm.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"
#endif  // GENBRIDGE_OPS_COMMON_NORM_GATED_RMS_NORM_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/norm/gated_rms_norm.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// One row: y = (w * round_x(x * rs)) * (z / (1 + exp(-z))), rs = 1 / sqrtf(sumsq / d + eps), sumsq in the
// header's order (16 lane chains over whole blocks of 16, ReduceAdd16, then the tail in order). y may be x.
void GatedRmsNormRow(const float* x, const float* z, const float* w, float* y, int64_t d, float eps, bool round_bf16) {
  V16 acc = Zero16();
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    const V16 p = Load16(x + i);
    acc = acc + p * p;
  }
  float ss = ReduceAdd16(acc);
  for (; i < d; ++i) ss += x[i] * x[i];
  const float rs = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  const V16 vrs = Set16(rs);
  i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    alignas(64) float e[kLanes];
    for (int l = 0; l < kLanes; ++l) e[l] = std::exp(-z[i + l]);
    V16 nx = Load16(x + i) * vrs;
    if (round_bf16) {
      alignas(64) bf16_t b[kLanes];
      Store16(b, nx);
      nx = Load16(static_cast<const bf16_t*>(b));
    }
    const V16 vz = Load16(z + i);
    Store16(y + i, (Load16(w + i) * nx) * (vz / (Set16(1.0f) + Load16(static_cast<const float*>(e)))));
  }
  for (; i < d; ++i) {
    float nx = x[i] * rs;
    if (round_bf16) nx = bf16_to_float(float_to_bf16(nx));
    y[i] = (w[i] * nx) * (z[i] / (1.0f + std::exp(-z[i])));
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops {
namespace detail {
HWY_EXPORT(GatedRmsNormRow);
}  // namespace detail
namespace {

constexpr const char* kOp = "gated_rms_norm";

Status validate(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& y) {
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "x", x));
  if (x.rank() < 1) return invalid_argument("gated_rms_norm: x has rank 0 but must have rank >= 1 ([..., D])");
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "x", x));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "z", z));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "z", z, detail::shape_of(x), "(x's shape)"));
  GB_RETURN_IF_ERROR(detail::check_unit_last_stride(kOp, "z", z));
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "w", w));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "w", w, {x.dim(-1)}, "([D], x's last dimension)"));
  if (x.dim(-1) == 0) return invalid_argument("gated_rms_norm: x's last dimension is 0; D must be >= 1");
  if (!std::isfinite(eps) || eps < 0.f) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(eps));
    return invalid_argument(std::string("gated_rms_norm: eps is ") + text + " but must be finite and >= 0");
  }
  GB_RETURN_IF_ERROR(detail::check_f32_or_bf16(kOp, "y", y));
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "y", y, detail::shape_of(x), "(x's shape)"));
  GB_RETURN_IF_ERROR(detail::check_no_overlap(kOp, "y", y, "x", x));
  return detail::check_no_overlap(kOp, "y", y, "z", z);
}

}  // namespace

Status gated_rms_norm(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& y) {
  GB_RETURN_IF_ERROR(validate(x, z, w, eps, y));
  const int64_t d = x.dim(-1);
  const int64_t rows = x.numel() / d;
  if (rows == 0) return ok_status();
  std::vector<float> wf(static_cast<size_t>(d));
  detail::load_row_f32(w, 1, 0, d, wf.data());
  const bool round_bf16 = x.dtype() == DType::kBF16;
  const auto row_kernel = GB_DISPATCH(detail::GatedRmsNormRow);
  genbridge::detail::parallel_for(rows, 3 * d, [&](int64_t r0, int64_t r1) {
    std::vector<float> xs(static_cast<size_t>(d)), zs(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      detail::load_row_f32(x, 1, r, d, xs.data());
      detail::load_row_f32(z, 1, r, d, zs.data());
      row_kernel(xs.data(), zs.data(), wf.data(), xs.data(), d, eps, round_bf16);
      detail::store_row_f32(y, 1, r, d, xs.data());
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
