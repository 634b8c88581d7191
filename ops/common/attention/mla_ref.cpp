#include "ops/common/attention/mla_ref.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/common/attention/attention_ref.h"

namespace genbridge::ref {

void fp8_mla_latent_row(const std::vector<double>& x, std::vector<double>& scales, std::vector<double>& dequantized) {
  constexpr size_t kTile = 128;
  scales.clear();
  dequantized.resize(x.size());
  for (size_t t = 0; t < x.size() / kTile; ++t) {
    std::vector<double> tile(x.begin() + t * kTile, x.begin() + (t + 1) * kTile), deq;
    double scale = 0;
    fp8_kv_row(tile, scale, deq);
    scales.push_back(scale);
    std::copy(deq.begin(), deq.end(), dequantized.begin() + t * kTile);
  }
}

std::vector<double> hadamard(const std::vector<double>& x) {
  const size_t n = x.size();
  std::vector<double> y(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    double s = 0;
    for (size_t j = 0; j < n; ++j) s += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * x[j];
    y[i] = s / std::sqrt(static_cast<double>(n));
  }
  return y;
}

void mla_attention(const std::vector<double>& ql, const std::vector<double>& qr, int64_t heads, int64_t L, int64_t R,
                   const std::vector<double>& latent, const std::vector<double>& rope, int64_t n, double scale,
                   std::vector<double>& out) {
  out.assign(static_cast<size_t>(heads * L), 0.0);
  if (n == 0) return;
  std::vector<double> s(static_cast<size_t>(n));
  for (int64_t h = 0; h < heads; ++h) {
    double m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      double d = 0;
      for (int64_t i = 0; i < L; ++i) d += ql[h * L + i] * latent[j * L + i];
      for (int64_t i = 0; i < R; ++i) d += qr[h * R + i] * rope[j * R + i];
      s[j] = scale * d;
      m = std::max(m, s[j]);
    }
    double z = 0;
    for (int64_t j = 0; j < n; ++j) z += (s[j] = std::exp(s[j] - m));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < L; ++i) out[h * L + i] += s[j] / z * latent[j * L + i];
    }
  }
}

std::vector<double> indexer_scores(const std::vector<double>& q, const std::vector<double>& w, int64_t heads,
                                   int64_t D, const std::vector<double>& keys, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t h = 0; h < heads; ++h) {
      double d = 0;
      for (int64_t i = 0; i < D; ++i) d += q[h * D + i] * keys[s * D + i];
      out[s] += w[h] * std::max(d, 0.0);
    }
  }
  return out;
}

std::vector<int64_t> topk_positions(const std::vector<double>& scores, int64_t k) {
  std::vector<int64_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return scores[a] > scores[b]; });
  idx.resize(std::min<size_t>(idx.size(), static_cast<size_t>(k)));
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<double> layer_norm(const std::vector<double>& x, const std::vector<double>& gamma,
                               const std::vector<double>& beta, double eps) {
  const double n = static_cast<double>(x.size());
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= n;
  for (double v : x) var += (v - mean) * (v - mean);
  var /= n;
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = (x[i] - mean) / std::sqrt(var + eps) * gamma[i] + beta[i];
  return y;
}

}  // namespace genbridge::ref
