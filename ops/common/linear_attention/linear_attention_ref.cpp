#include "ops/common/linear_attention/linear_attention_ref.h"

#include <cmath>

namespace genbridge::ref {
namespace {
double silu(double v) { return v / (1.0 + std::exp(-v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }
}  // namespace

void causal_conv1d(const std::vector<double>& x, int64_t q_len, int64_t C, const std::vector<double>& weight,
                   int64_t K, std::vector<double>& conv_state, std::vector<double>& y) {
  const int64_t H = K - 1;
  std::vector<double> xp(static_cast<size_t>((H + q_len) * C));
  for (int64_t i = 0; i < H * C; ++i) xp[i] = conv_state[i];
  for (int64_t i = 0; i < q_len * C; ++i) xp[H * C + i] = x[i];
  y.assign(static_cast<size_t>(q_len * C), 0.0);
  for (int64_t t = 0; t < q_len; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < K; ++j) acc += weight[c * K + j] * xp[(t + j) * C + c];
      y[t * C + c] = silu(acc);
    }
  for (int64_t i = 0; i < H * C; ++i) conv_state[i] = xp[q_len * C + i];
}

void gdn_gating(const std::vector<double>& a, const std::vector<double>& b, const std::vector<double>& A_log,
                const std::vector<double>& dt_bias, int64_t T, int64_t nv, std::vector<double>& g,
                std::vector<double>& beta) {
  g.assign(static_cast<size_t>(T * nv), 0.0);
  beta.assign(static_cast<size_t>(T * nv), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nv; ++h) {
      const double v = a[t * nv + h] + dt_bias[h];
      const double softplus = v > 20.0 ? v : std::log1p(std::exp(v));
      g[t * nv + h] = -std::exp(A_log[h]) * softplus;
      beta[t * nv + h] = sigmoid(b[t * nv + h]);
    }
}

void gated_delta_rule(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                      const std::vector<double>& g, const std::vector<double>& beta, int64_t q_len, int64_t nk,
                      int64_t nv, int64_t dk, int64_t dv, double scale, std::vector<double>& state,
                      std::vector<double>& out) {
  out.assign(static_cast<size_t>(q_len * nv * dv), 0.0);
  const int64_t group = nv / nk;
  std::vector<double> kn(static_cast<size_t>(dk)), qn(static_cast<size_t>(dk)), u(static_cast<size_t>(dv));
  for (int64_t t = 0; t < q_len; ++t)
    for (int64_t h = 0; h < nv; ++h) {
      const int64_t j = h / group;
      double sk = 0.0, sq = 0.0;
      for (int64_t i = 0; i < dk; ++i) {
        sk += k[(t * nk + j) * dk + i] * k[(t * nk + j) * dk + i];
        sq += q[(t * nk + j) * dk + i] * q[(t * nk + j) * dk + i];
      }
      for (int64_t i = 0; i < dk; ++i) {
        kn[i] = k[(t * nk + j) * dk + i] / std::sqrt(sk + 1e-6);
        qn[i] = scale * q[(t * nk + j) * dk + i] / std::sqrt(sq + 1e-6);
      }
      double* S = state.data() + h * dk * dv;
      const double decay = std::exp(g[t * nv + h]), b = beta[t * nv + h];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
      for (int64_t c = 0; c < dv; ++c) {
        double acc = 0.0;
        for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + c] * kn[i];
        u[c] = b * (v[(t * nv + h) * dv + c] - acc);  // delta
      }
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t c = 0; c < dv; ++c) S[i * dv + c] += kn[i] * u[c];
      for (int64_t c = 0; c < dv; ++c) {
        double acc = 0.0;
        for (int64_t i = 0; i < dk; ++i) acc += S[i * dv + c] * qn[i];
        out[(t * nv + h) * dv + c] = acc;
      }
    }
}

void gated_rms_norm(const std::vector<double>& x, const std::vector<double>& z, const std::vector<double>& w,
                    int64_t rows, int64_t D, double eps, std::vector<double>& y) {
  y.assign(static_cast<size_t>(rows * D), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += x[r * D + i] * x[r * D + i];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
    for (int64_t i = 0; i < D; ++i) y[r * D + i] = w[i] * (x[r * D + i] * rs) * silu(z[r * D + i]);
  }
}

void sigmoid_mul(const std::vector<double>& x, const std::vector<double>& gate, std::vector<double>& y) {
  y.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * sigmoid(gate[i]);
}

}  // namespace genbridge::ref
