// norm/layer_norm's row kernel, compiled once per CPU target with Highway. Per row: mean = the 16-lane sum
// of x / D; d = x - mean (padding lanes 0); var = the 16-lane sum of fma(d, d) / D; rstd = 1 / sqrt(var +
// eps) in fp32; y = fma(d * rstd, gamma, beta). The same IEEE operations on every target.
#ifndef GENBRIDGE_OPS_NORM_LAYER_NORM_SHARED_
#define GENBRIDGE_OPS_NORM_LAYER_NORM_SHARED_

#include "ops/common/norm/layer_norm_kernel.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "ops/common/tensor/rows.h"

#endif  // GENBRIDGE_OPS_NORM_LAYER_NORM_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/norm/layer_norm_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();

// Rows [r0, r1) of x (as rows over the last dim). g, b: gamma and beta as fp32, padded to dp with zeros.
void LayerNormRows(const TensorView& x, const float* g, const float* b, float eps, const TensorView& y, int64_t r0,
                   int64_t r1) {
  const int64_t D = x.dim(-1), dp = (D + 15) / 16 * 16;
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(dp)) buf.resize(static_cast<size_t>(dp));
  float* row = buf.data();
  const float inv_d = 1.0f / static_cast<float>(D);
  for (int64_t r = r0; r < r1; ++r) {
    load_row_f32(x, 1, r, D, row);
    for (int64_t i = D; i < dp; ++i) row[i] = 0.f;
    V16 s = Zero16();
    for (int64_t i = 0; i < dp; i += kLanes) s = s + Load16(row + i);
    const float mean = ReduceAdd16(s) * inv_d;
    for (int64_t i = 0; i < D; ++i) row[i] = row[i] - mean;
    V16 v = Zero16();
    for (int64_t i = 0; i < dp; i += kLanes) {
      const V16 d = Load16(row + i);
      v = Fma16(d, d, v);
    }
    const float var = ReduceAdd16(v) * inv_d;
    const V16 rstd = Set16(1.0f / std::sqrt(var + eps));
    for (int64_t i = 0; i < dp; i += kLanes) {
      Store16(row + i, Fma16(Load16(row + i) * rstd, Load16(g + i), Load16(b + i)));
    }
    store_row_f32(y, 1, r, D, row);
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(LayerNormRows);

Status run_layer_norm(const TensorView& x, const TensorView& gamma, const TensorView& beta, float eps,
                      const TensorView& y) {
  const char* op = "layer_norm";
  GB_RETURN_IF_ERROR(check_float_input(op, "x", x));
  if (x.rank() < 1 || x.dim(-1) < 1) {
    return invalid_argument(std::string(op) + ": x has shape " + x.shape_string() +
                            " but must have rank >= 1 and a last dimension >= 1");
  }
  const int64_t D = x.dim(-1);
  for (const auto& [name, t] : {std::pair<const char*, const TensorView*>{"gamma", &gamma}, {"beta", &beta}}) {
    GB_RETURN_IF_ERROR(check_float_input(op, name, *t));
    if (t->rank() != 1 || t->dim(0) != D) {
      return invalid_argument(std::string(op) + ": " + name + " has shape " + t->shape_string() + " but must be [" +
                              std::to_string(D) + "] (x's last dimension)");
    }
  }
  GB_RETURN_IF_ERROR(check_float_input(op, "y", y));
  bool same = y.rank() == x.rank();
  for (int d = 0; same && d < x.rank(); ++d) same = y.dim(d) == x.dim(d);
  if (!same) {
    return invalid_argument(std::string(op) + ": y has shape " + y.shape_string() + " but must have x's shape " +
                            x.shape_string());
  }
  if (!(std::isfinite(eps) && eps >= 0.f)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(eps));
    return invalid_argument(std::string(op) + ": eps is " + text + " but must be finite and >= 0");
  }
  const int64_t dp = (D + 15) / 16 * 16;
  std::vector<float> gb(static_cast<size_t>(2 * dp), 0.f);
  load_row_f32(gamma, 1, 0, D, gb.data());
  load_row_f32(beta, 1, 0, D, gb.data() + dp);
  const int64_t rows = x.numel() / D;
  if (rows == 0) return ok_status();
  const auto run = GB_DISPATCH(LayerNormRows);
  genbridge::detail::parallel_for(rows, D * 4, [&](int64_t r0, int64_t r1) {
    run(x, gb.data(), gb.data() + dp, eps, y, r0, r1);
  });
  return ok_status();
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
