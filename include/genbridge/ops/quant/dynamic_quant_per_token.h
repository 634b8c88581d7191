#pragma once
// Stable operator quant/dynamic_quant_per_token (docs/design.md#stable-operator-contracts): symmetric int8 with one
// fp32 scale per row.

#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::ops {

// Floor on a row's amax, so that an all-zero row gets a finite, non-zero scale.
inline constexpr float kDynamicQuantPerTokenDefaultEps = 1e-10f;

// Quantizes each row (the last dimension) of x:
//   scale[r] = fl32(max(amax_r, eps) / 127),  q[r, c] = clamp(rne(fl32(x[r, c] / scale[r])), -127, 127)
// where amax_r = max |x[r, :]| and rne rounds to nearest, ties to even. An all-zero row gives q = 0 and
// scale = eps / 127. A row holding NaN gets scale NaN, one holding +-inf (and no NaN) scale +inf; such
// rows get q = 0. x: fp32/fp16/bf16 of rank >= 1, any strides; q: int8 with x's shape, any strides;
// scale: fp32 with shape x.shape[:-1] (rank 0 for a rank-1 x), any strides. eps finite and > 0.
// Writes q and scale only (nothing on error); does not retain views; results do not depend on the
// thread count.
Status dynamic_quant_per_token(const TensorView& x, float eps, const TensorView& q, const TensorView& scale);

}  // namespace genbridge::ops
