#include "ops/reference/moe.h"

#include <cmath>

#include "ops/reference/linear.h"

namespace genbridge::ref {

void softmax_rows(const std::vector<double>& logits, int64_t T, int64_t E, std::vector<double>& p) {
  p.assign(static_cast<size_t>(T * E), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    double m = logits[t * E];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, logits[t * E + e]);
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += std::exp(logits[t * E + e] - m);
    for (int64_t e = 0; e < E; ++e) p[t * E + e] = std::exp(logits[t * E + e] - m) / s;
  }
}

void swiglu_expert(const double* x, const double* wg, const double* wu, const double* wd, int64_t H, int64_t I,
                   double* out, double* sensitivity) {
  std::vector<double> a(static_cast<size_t>(I)), da(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0, G = 0, U = 0;
    for (int64_t k = 0; k < H; ++k) {
      g += wg[i * H + k] * x[k];
      u += wu[i * H + k] * x[k];
      G += std::abs(wg[i * H + k] * x[k]);
      U += std::abs(wu[i * H + k] * x[k]);
    }
    a[i] = silu(g) * u;
    da[i] = std::abs(a[i]) + 1.1 * G * std::abs(u) + std::abs(silu(g)) * U;
  }
  for (int64_t h = 0; h < H; ++h) {
    double s = 0, d = 0;
    for (int64_t i = 0; i < I; ++i) {
      s += wd[h * I + i] * a[i];
      d += std::abs(wd[h * I + i]) * da[i];
    }
    out[h] = s;
    sensitivity[h] = d;
  }
}

}  // namespace genbridge::ref
