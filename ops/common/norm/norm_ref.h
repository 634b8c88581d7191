#pragma once
// fp64 oracles for the norm/* operators (tests and benchmarks only). Inputs are the exact values of
// the (already rounded) input elements; outputs are unrounded fp64.

#include <cstdint>
#include <vector>

namespace genbridge::ref {

// y[r, c] = x[r, c] / sqrt(mean_c(x[r, :]^2) + eps) * w_eff[c]; rstd[r] is the fp64 rstd.
void rms_norm(const std::vector<double>& x, const std::vector<double>& w_eff, int64_t rows, double eps,
              std::vector<double>& y, std::vector<double>& rstd);

}  // namespace genbridge::ref
