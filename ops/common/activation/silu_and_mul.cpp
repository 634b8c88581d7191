// activation/silu_and_mul, one implementation for every target. The row loop is compiled once per CPU
// target (Highway, dispatched once per call); exp is the C library's expf, as in expert_ffn's
// silu_mul (ops/common/activation/swiglu.h), so both give the same bits.
#ifndef GENBRIDGE_OPS_COMMON_ACTIVATION_SILU_AND_MUL_SHARED_
#define GENBRIDGE_OPS_COMMON_ACTIVATION_SILU_AND_MUL_SHARED_
#include "genbridge/ops/activation/silu_and_mul.h"

#include <cmath>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/tensor/rows.h"
#include "ops/common/tensor/tensor_checks.h"
#endif  // GENBRIDGE_OPS_COMMON_ACTIVATION_SILU_AND_MUL_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/activation/silu_and_mul.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "core/simd/vec16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace genbridge::ops::HWY_NAMESPACE {
using namespace ::genbridge::simd::HWY_NAMESPACE;

// out[i] = (g / (1 + exp(-g))) * u with g = in[i], u = in[d + i]: each step rounded once, as silu_mul.
void SiluMulRow(const float* HWY_RESTRICT in, float* HWY_RESTRICT out, int64_t d) {
  int64_t i = 0;
  for (; i + kLanes <= d; i += kLanes) {
    alignas(64) float e[kLanes];
    for (int l = 0; l < kLanes; ++l) e[l] = std::exp(-in[i + l]);
    const V16 g = Load16(in + i);
    Store16(out + i, (g / (Set16(1.0f) + Load16(static_cast<const float*>(e)))) * Load16(in + d + i));
  }
  for (; i < d; ++i) out[i] = (in[i] / (1.0f + std::exp(-in[i]))) * in[d + i];
}

}  // namespace genbridge::ops::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::ops {
HWY_EXPORT(SiluMulRow);
namespace {

constexpr const char* kOp = "silu_and_mul";

Status validate(const TensorView& x, const TensorView& y) {
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "x", x));
  if (x.rank() < 1) return invalid_argument("silu_and_mul: x has rank 0 but must have rank >= 1 ([..., 2d])");
  if (x.dim(-1) % 2 != 0) {
    return invalid_argument("silu_and_mul: x's last dimension is " + std::to_string(x.dim(-1)) +
                            " but must be even ([gate | up], 2d elements)");
  }
  GB_RETURN_IF_ERROR(detail::check_float_tensor(kOp, "y", y));
  std::vector<int64_t> want = detail::shape_of(x);
  want.back() /= 2;
  GB_RETURN_IF_ERROR(detail::check_shape(kOp, "y", y, want, "(x's leading shape + [d], d = half x's last dimension)"));
  return detail::check_no_overlap(kOp, "y", y, "x", x);
}

}  // namespace

Status silu_and_mul(const TensorView& x, const TensorView& y) {
  GB_RETURN_IF_ERROR(validate(x, y));
  const int64_t d = y.dim(-1);
  const int64_t rows = d == 0 ? 0 : y.numel() / d;
  if (rows == 0) return ok_status();
  const auto silu_mul_row = GB_DISPATCH(SiluMulRow);  // the CPU target's row kernel, chosen once per call
  genbridge::detail::parallel_for(rows, 2 * d, [&](int64_t r0, int64_t r1) {
    std::vector<float> in(static_cast<size_t>(2 * d)), out(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      detail::load_row_f32(x, 1, r, 2 * d, in.data());
      silu_mul_row(in.data(), out.data(), d);
      detail::store_row_f32(y, 1, r, d, out.data());
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
#endif  // HWY_ONCE
