#include "ops/common/residual/hyper_connection_ref.h"

#include <algorithm>
#include <cmath>

namespace genbridge::ref {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// mix[i] = fn[i] . (x / sqrt(mean(x^2) + eps)) for i < rows.
std::vector<double> mixes(const double* x, int64_t K, const double* fn, int64_t rows, double norm_eps) {
  double ss = 0.0;
  for (int64_t k = 0; k < K; ++k) ss += x[k] * x[k];
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(K) + norm_eps);
  std::vector<double> m(static_cast<size_t>(rows), 0.0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t k = 0; k < K; ++k) m[i] += fn[i * K + k] * (x[k] * r);
  return m;
}

void collapse(const double* x, int64_t n, int64_t H, const std::vector<double>& pre, std::vector<double>& collapsed) {
  collapsed.assign(static_cast<size_t>(H), 0.0);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t h = 0; h < H; ++h) collapsed[h] += pre[j] * x[j * H + h];
}

}  // namespace

void hc_pre_token(const double* x, int64_t n, int64_t H, const double* fn, const double* base, const double* scale,
                  double norm_eps, double hc_eps, int64_t sinkhorn_iters, std::vector<double>& pre,
                  std::vector<double>& post, std::vector<double>& comb, std::vector<double>& collapsed) {
  const std::vector<double> m = mixes(x, n * H, fn, (2 + n) * n, norm_eps);
  pre.resize(static_cast<size_t>(n));
  post.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    pre[j] = sigmoid(m[j] * scale[0] + base[j]) + hc_eps;
    post[j] = 2.0 * sigmoid(m[n + j] * scale[1] + base[n + j]);
  }
  comb.assign(static_cast<size_t>(n * n), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t k = 0; k < n; ++k) mx = std::max(mx, m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k]);
    for (int64_t k = 0; k < n; ++k) sum += std::exp(m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k] - mx);
    for (int64_t k = 0; k < n; ++k) {
      comb[j * n + k] = std::exp(m[2 * n + j * n + k] * scale[2] + base[2 * n + j * n + k] - mx) / sum + hc_eps;
    }
  }
  auto columns = [&] {
    for (int64_t k = 0; k < n; ++k) {
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) sum += comb[j * n + k];
      for (int64_t j = 0; j < n; ++j) comb[j * n + k] /= sum + hc_eps;
    }
  };
  columns();
  for (int64_t it = 1; it < sinkhorn_iters; ++it) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t k = 0; k < n; ++k) sum += comb[j * n + k];
      for (int64_t k = 0; k < n; ++k) comb[j * n + k] /= sum + hc_eps;
    }
    columns();
  }
  collapse(x, n, H, pre, collapsed);
}

void hc_head_token(const double* x, int64_t n, int64_t H, const double* fn, const double* base, const double* scale,
                   double norm_eps, double hc_eps, std::vector<double>& pre, std::vector<double>& collapsed) {
  const std::vector<double> m = mixes(x, n * H, fn, n, norm_eps);
  pre.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) pre[j] = sigmoid(m[j] * scale[0] + base[j]) + hc_eps;
  collapse(x, n, H, pre, collapsed);
}

void hc_post_token(const double* y, const double* post, const double* comb, const double* x, int64_t n, int64_t H,
                   std::vector<double>& out) {
  out.assign(static_cast<size_t>(n * H), 0.0);
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t h = 0; h < H; ++h) {
      double v = post[k] * y[h];
      for (int64_t j = 0; j < n; ++j) v += comb[j * n + k] * x[j * H + h];
      out[k * H + h] = v;
    }
  }
}

}  // namespace genbridge::ref
