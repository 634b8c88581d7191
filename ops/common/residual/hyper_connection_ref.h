#pragma once
// fp64 oracles for residual/hyper_connection (tests and benchmarks only), one token at a time, in Hugging
// Face's order (the streams normalized first, then projected). Inputs are the exact values of the (already
// rounded) input elements; outputs are unrounded fp64.

#include <cstdint>
#include <vector>

namespace genbridge::ref {

// hc_pre for one token: x = streams[t] flattened [n H] (stream-major); fn [(2 + n) n, n H], base [(2 + n) n],
// scale [3], row-major. Outputs pre [n], post [n], comb [n, n] (comb[j n + k]) and collapsed [H].
void hc_pre_token(const double* x, int64_t n, int64_t H, const double* fn, const double* base, const double* scale,
                  double norm_eps, double hc_eps, int64_t sinkhorn_iters, std::vector<double>& pre,
                  std::vector<double>& post, std::vector<double>& comb, std::vector<double>& collapsed);

// hc_head for one token: fn [n, n H], base [n], scale [1]. Outputs pre [n] and collapsed [H].
void hc_head_token(const double* x, int64_t n, int64_t H, const double* fn, const double* base, const double* scale,
                   double norm_eps, double hc_eps, std::vector<double>& pre, std::vector<double>& collapsed);

// hc_post for one token: out[k H + h] = post[k] y[h] + sum_j comb[j n + k] x[j H + h].
void hc_post_token(const double* y, const double* post, const double* comb, const double* x, int64_t n, int64_t H,
                   std::vector<double>& out);

}  // namespace genbridge::ref
