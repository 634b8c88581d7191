#include "ops/common/linear/quant_linear_ref.h"

#include <cmath>

#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "ops/common/quant/quant_ref.h"

namespace genbridge::ref {

void w8a8_linear(const std::vector<double>& x, const std::vector<int8_t>& qw, const std::vector<float>& sw, int64_t M,
                 int64_t N, int64_t K, std::vector<float>& y) {
  std::vector<int8_t> qx;
  std::vector<float> sx;
  dynamic_quant_per_token(x, M, K, ops::kDynamicQuantPerTokenDefaultEps, qx, sx);
  y.assign(static_cast<size_t>(M * N), 0.f);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      int64_t acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += int64_t{qx[m * K + k]} * int64_t{qw[n * K + k]};
      const float a = static_cast<float>(acc);
      const float t = a * sx[m];
      y[m * N + n] = t * sw[n];
    }
  }
}

std::vector<double> mx_weight_values(const std::vector<uint8_t>& q, const std::vector<uint8_t>& scale, int64_t N,
                                     int64_t K, DType element) {
  const int64_t pairs = ((K + 31) / 32 + 1) / 2;
  const bool fp4 = element == DType::kFp4E2M1x2;
  std::vector<double> w(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      uint8_t code;
      if (fp4) {
        const uint8_t b = q[n * (K / 2) + k / 2];
        code = k % 2 ? b >> 4 : b & 0xf;
      } else {
        code = q[n * K + k];
      }
      const uint8_t s = scale[n * pairs * 2 + k / 32];
      w[n * K + k] =
          s == 0xff ? std::nan("") : std::ldexp(mx_element_value(fp4 ? DType::kFp4E2M1x2 : element, code), s - 127);
    }
  }
  return w;
}

}  // namespace genbridge::ref
