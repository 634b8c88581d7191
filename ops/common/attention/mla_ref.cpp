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

void mxfp8_mla_latent_row(const std::vector<double>& x, std::vector<int>& scale_bytes,
                          std::vector<double>& dequantized) {
  constexpr size_t kGroup = 64;
  scale_bytes.clear();
  dequantized.resize(x.size());
  for (size_t g = 0; g < x.size() / kGroup; ++g) {
    double amax = 0;
    for (size_t i = g * kGroup; i < (g + 1) * kGroup; ++i) {
      if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(x[i]));
    }
    // fp32 division of two fp32 values, correctly rounded (rounding the fp64 quotient once is exact here).
    const double v = static_cast<float>(std::max(amax, static_cast<double>(1e-4f)) / 448.0);
    int k = 0;
    const double m = std::frexp(v, &k);  // v = m * 2^k, m in [0.5, 1)
    int e = (m == 0.5 ? k - 1 : k) + 127;
    if (std::isinf(v)) e = 254;
    e = std::min(e, 254);
    scale_bytes.push_back(e);
    const double scale = std::ldexp(1.0, e - 127);
    for (size_t i = g * kGroup; i < (g + 1) * kGroup; ++i) {
      const double q = std::clamp(static_cast<double>(static_cast<float>(x[i] / scale)), -448.0, 448.0);
      dequantized[i] = round_to_minifloat(q, 3, -6) * scale;
    }
  }
}

void sharedkv_attention(const std::vector<double>& q, int64_t heads, int64_t D, const std::vector<double>& rows,
                        int64_t n, double scale, const std::vector<double>& sinks, std::vector<double>& out) {
  out.assign(static_cast<size_t>(heads * D), 0.0);
  if (n == 0) return;
  std::vector<double> s(static_cast<size_t>(n));
  for (int64_t h = 0; h < heads; ++h) {
    double m = sinks.empty() ? -INFINITY : sinks[h];
    for (int64_t j = 0; j < n; ++j) {
      double d = 0;
      for (int64_t i = 0; i < D; ++i) d += q[h * D + i] * rows[j * D + i];
      s[j] = scale * d;
      m = std::max(m, s[j]);
    }
    double z = sinks.empty() ? 0.0 : std::exp(sinks[h] - m);
    for (int64_t j = 0; j < n; ++j) z += (s[j] = std::exp(s[j] - m));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < D; ++i) out[h * D + i] += s[j] / z * rows[j * D + i];
    }
  }
}

std::vector<double> kv_compress(const std::vector<double>& kv, const std::vector<double>& gate,
                                const std::vector<double>& ape, int64_t ratio, int64_t D, bool overlap,
                                bool has_previous) {
  const int64_t width = (overlap ? 2 : 1) * D;
  const int64_t rows = static_cast<int64_t>(kv.size()) / width;
  const int64_t windows = (rows - (overlap ? ratio : 0)) / ratio;
  std::vector<double> out(static_cast<size_t>(windows * D), 0.0);
  for (int64_t k = 0; k < windows; ++k) {
    for (int64_t d = 0; d < D; ++d) {
      std::vector<std::pair<double, double>> slots;  // (score, value)
      if (!overlap) {
        for (int64_t i = 0; i < ratio; ++i) {
          const int64_t r = k * ratio + i;
          slots.emplace_back(gate[r * width + d] + ape[i * width + d], kv[r * width + d]);
        }
      } else {
        const int64_t b = (k + 1) * ratio;
        for (int64_t i = 0; i < ratio && (k > 0 || has_previous); ++i) {
          const int64_t r = b - ratio + i;
          slots.emplace_back(gate[r * width + d] + ape[i * width + d], kv[r * width + d]);
        }
        for (int64_t i = 0; i < ratio; ++i) {
          const int64_t r = b + i;
          slots.emplace_back(gate[r * width + D + d] + ape[i * width + D + d], kv[r * width + D + d]);
        }
      }
      double mx = -INFINITY, z = 0, acc = 0;
      for (const auto& sv : slots) mx = std::max(mx, sv.first);
      for (const auto& [sc, v] : slots) {
        z += std::exp(sc - mx);
        acc += std::exp(sc - mx) * v;
      }
      out[static_cast<size_t>(k * D + d)] = acc / z;
    }
  }
  return out;
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
