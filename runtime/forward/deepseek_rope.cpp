#include "runtime/forward/deepseek_rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace genbridge::model {

double yarn_get_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

std::vector<double> deepseek_rope_inv_freq(const ModelConfig& c) {
  return rope_inv_freq(c.deepseek.qk_rope_head_dim, c.rope_theta, c.deepseek.yarn ? &c.deepseek.rope_scaling : nullptr);
}

std::vector<double> rope_inv_freq(int64_t d, double base, const YarnRopeScaling* yarn) {
  const int64_t half = d / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(d));
  if (!yarn) return inv;
  const YarnRopeScaling& s = *yarn;
  const auto correction_dim = [&](double rotations) {
    return static_cast<double>(d) *
           std::log(static_cast<double>(s.original_max_position_embeddings) / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    inv[i] = inv[i] * (1.0 - ramp) + inv[i] / s.factor * ramp;
  }
  return inv;
}

double mla_softmax_scale(const ModelConfig& c) {
  double scale = 1.0 / std::sqrt(static_cast<double>(c.deepseek.qk_head_dim()));
  const YarnRopeScaling& s = c.deepseek.rope_scaling;
  if (c.deepseek.yarn && s.mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(s.factor, s.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

double indexer_weight_scale(const ModelConfig& c) {
  return 1.0 / std::sqrt(static_cast<double>(c.deepseek.index_n_heads)) /
         std::sqrt(static_cast<double>(c.deepseek.index_head_dim));
}

RopeTables make_rope_tables(const ModelConfig& c, int64_t num_positions) {
  const std::vector<double> inv = deepseek_rope_inv_freq(c);
  RopeTables t;
  t.half = static_cast<int64_t>(inv.size());
  t.cos.resize(static_cast<size_t>(num_positions * t.half));
  t.sin.resize(static_cast<size_t>(num_positions * t.half));
  for (int64_t p = 0; p < num_positions; ++p) {
    for (int64_t i = 0; i < t.half; ++i) {
      const double a = static_cast<double>(p) * inv[i];
      t.cos[p * t.half + i] = static_cast<float>(std::cos(a));
      t.sin[p * t.half + i] = static_cast<float>(std::sin(a));
    }
  }
  return t;
}

void rope_interleaved(const RopeTables& t, int64_t pos, std::span<float> x) {
  const float* c = t.cos.data() + pos * t.half;
  const float* s = t.sin.data() + pos * t.half;
  for (int64_t i = 0; i < t.half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * c[i] - b * s[i];
    x[2 * i + 1] = b * c[i] + a * s[i];
  }
}

void rope_half_split(const RopeTables& t, int64_t pos, std::span<float> x) {
  const float* c = t.cos.data() + pos * t.half;
  const float* s = t.sin.data() + pos * t.half;
  for (int64_t i = 0; i < t.half; ++i) {
    const float a = x[i], b = x[i + t.half];
    x[i] = a * c[i] - b * s[i];
    x[i + t.half] = b * c[i] + a * s[i];
  }
}

}  // namespace genbridge::model
