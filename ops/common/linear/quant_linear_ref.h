#pragma once
// Oracles for linear/quant_linear (tests and benchmarks only), written from the scheme definitions in
// include/genbridge/ops/linear/quant_linear.h with the quant oracles of ops/common/quant/quant_ref.h; they do not
// call the library's kernels or codecs. Inputs are row-major.

#include <cstdint>
#include <vector>

#include "genbridge/core/dtype.h"

namespace genbridge::ref {

// W8A8: x [M, K] (exact input values), weight int8 [N, K] and fp32 scales [N]. y[m, n] is the scheme's
// exact fp32 result: the int64 sum of products (exact), then fl32(fl32(fl32(acc) * sx[m]) * sw[n]) with
// (qx, sx) = dynamic_quant_per_token(x row) — bit-exact, not a bound.
void w8a8_linear(const std::vector<double>& x, const std::vector<int8_t>& qw, const std::vector<float>& sw, int64_t M,
                 int64_t N, int64_t K, std::vector<float>& y);

// The values an MX weight stands for: w[n, k] = value(code) * 2^(s - 127) (fp64; exact), from the codes
// (fp8_e4m3fn [N, K], or fp4_e2m1 packed [N, K / 2]) and the pair-layout e8m0 scales [N, pairs, 2].
std::vector<double> mx_weight_values(const std::vector<uint8_t>& q, const std::vector<uint8_t>& scale, int64_t N,
                                     int64_t K, DType element);

}  // namespace genbridge::ref
