#include "ops/common/norm/norm_ref.h"

#include <cmath>

namespace genbridge::ref {

void rms_norm(const std::vector<double>& x, const std::vector<double>& w_eff, int64_t rows, double eps,
              std::vector<double>& y, std::vector<double>& rstd) {
  const int64_t cols = static_cast<int64_t>(w_eff.size());
  y.assign(x.size(), 0.0);
  rstd.assign(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < cols; ++c) ss += x[r * cols + c] * x[r * cols + c];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(cols) + eps);
    rstd[r] = rs;
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * rs * w_eff[c];
  }
}

}  // namespace genbridge::ref
