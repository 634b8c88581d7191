#include "ops/common/linear/linear_ref.h"

#include <cmath>

namespace genbridge::ref {

void linear(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* bias, int64_t M,
            int64_t N, int64_t K, std::vector<double>& y, std::vector<double>& abs_sum) {
  y.assign(static_cast<size_t>(M * N), 0.0);
  abs_sum.assign(static_cast<size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0, a = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = x[m * K + k] * w[n * K + k];
        s += p;
        a += std::abs(p);
      }
      if (bias) {
        s += (*bias)[n];
        a += std::abs((*bias)[n]);
      }
      y[m * N + n] = s;
      abs_sum[m * N + n] = a;
    }
  }
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

}  // namespace genbridge::ref
