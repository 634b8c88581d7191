#pragma once
// fp64 oracles for linear/linear and activation/silu_and_mul (tests and benchmarks only). Inputs are
// the exact values of the (already rounded) input elements; outputs are unrounded fp64.

#include <cstdint>
#include <vector>

namespace genbridge::ref {

// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]); abs_sum[m, n] = sum_k |x[m, k] * w[n, k]| (+ |bias[n]|),
// the scale that bounds the error of any fp32 summation order. x: [M, K], w: [N, K], row-major.
void linear(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* bias, int64_t M,
            int64_t N, int64_t K, std::vector<double>& y, std::vector<double>& abs_sum);

// silu(g) = g / (1 + exp(-g)).
double silu(double g);

}  // namespace genbridge::ref
