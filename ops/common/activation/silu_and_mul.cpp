// activation/silu_and_mul, one implementation for every target.
#include "genbridge/ops/activation/silu_and_mul.h"

#include <vector>

#include "core/parallel.h"
#include "ops/detail/common/rows.h"
#include "ops/detail/activation/swiglu.h"
#include "ops/detail/common/tensor_checks.h"

namespace genbridge::ops {
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
  genbridge::detail::parallel_for(rows, 2 * d, [&](int64_t r0, int64_t r1) {
    std::vector<float> in(static_cast<size_t>(2 * d)), out(static_cast<size_t>(d));
    for (int64_t r = r0; r < r1; ++r) {
      detail::load_row_f32(x, 1, r, 2 * d, in.data());
      for (int64_t i = 0; i < d; ++i) out[i] = detail::silu_mul(in[i], in[d + i]);
      detail::store_row_f32(y, 1, r, d, out.data());
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops
