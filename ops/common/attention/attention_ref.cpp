#include "ops/common/attention/attention_ref.h"

#include <algorithm>
#include <cmath>

namespace genbridge::ref {

double round_to_minifloat(double v, int mantissa_bits, int min_exponent) {
  if (v == 0.0 || !std::isfinite(v)) return v;
  int e = 0;
  std::frexp(std::fabs(v), &e);  // |v| = f * 2^e, f in [0.5, 1): the leading bit has exponent e - 1
  const int lead = std::max(e - 1, min_exponent);
  const double quantum = std::ldexp(1.0, lead - mantissa_bits);
  return std::nearbyint(v / quantum) * quantum;  // v / quantum is exact; nearbyint rounds ties to even
}

namespace {
double abs_max(const std::vector<double>& x) {
  double m = 0.0;
  for (double v : x) m = std::max(m, std::fabs(v));
  return m;
}
double to_f32(double v) { return static_cast<double>(static_cast<float>(v)); }
}  // namespace

void int8_kv_row(const std::vector<double>& x, double& scale, std::vector<double>& dequantized) {
  const double tiny = 127.0 * std::ldexp(1.0, -24);
  const double scale32 = to_f32(std::max(abs_max(x), tiny) / 127.0);  // the fp32 quotient
  scale = round_to_minifloat(scale32, 10, -14);                        // stored as fp16
  dequantized.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double code = std::clamp(std::nearbyint(to_f32(x[i] / scale)), -127.0, 127.0);
    dequantized[i] = code * scale;
  }
}

void fp8_kv_row(const std::vector<double>& x, double& scale, std::vector<double>& dequantized) {
  const double tiny = 448.0 * std::ldexp(1.0, -149);
  scale = to_f32(std::max(abs_max(x), tiny) / 448.0);  // stored as fp32
  dequantized.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double code = std::clamp(round_to_minifloat(to_f32(x[i] / scale), 3, -6), -448.0, 448.0);
    dequantized[i] = code * scale;
  }
}

void rope(const std::vector<int64_t>& positions, int64_t num_heads, int64_t head_dim, double theta,
          std::vector<double>& x) {
  const int64_t half = head_dim / 2;
  for (size_t t = 0; t < positions.size(); ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const float inv_freq = static_cast<float>(1.0 / std::pow(theta, 2.0 * static_cast<double>(i) / head_dim));
      const double a = static_cast<double>(static_cast<float>(positions[t]) * inv_freq);  // fp32 angle
      const double c = std::cos(a), s = std::sin(a);
      for (int64_t h = 0; h < num_heads; ++h) {
        double* row = x.data() + (static_cast<int64_t>(t) * num_heads + h) * head_dim;
        const double x1 = row[i], x2 = row[i + half];
        row[i] = x1 * c - x2 * s;
        row[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

void attention(const std::vector<double>& q, int64_t q_len, int64_t num_heads, const std::vector<double>& k,
               const std::vector<double>& v, int64_t ctx, int64_t num_kv_heads, int64_t head_dim, double scale,
               std::vector<double>& out) {
  const int64_t group = num_heads / num_kv_heads;
  out.assign(static_cast<size_t>(q_len * num_heads * head_dim), 0.0);
  std::vector<double> score(static_cast<size_t>(ctx));
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t pos = ctx - q_len + i;
    for (int64_t h = 0; h < num_heads; ++h) {
      const int64_t kh = h / group;
      const double* qr = q.data() + (i * num_heads + h) * head_dim;
      double mx = -INFINITY;
      for (int64_t j = 0; j <= pos; ++j) {
        const double* kr = k.data() + (j * num_kv_heads + kh) * head_dim;
        double dot = 0.0;
        for (int64_t c = 0; c < head_dim; ++c) dot += qr[c] * kr[c];
        score[j] = dot * scale;
        mx = std::max(mx, score[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= pos; ++j) sum += (score[j] = std::exp(score[j] - mx));
      double* o = out.data() + (i * num_heads + h) * head_dim;
      for (int64_t j = 0; j <= pos; ++j) {
        const double* vr = v.data() + (j * num_kv_heads + kh) * head_dim;
        for (int64_t c = 0; c < head_dim; ++c) o[c] += score[j] / sum * vr[c];
      }
    }
  }
}

}  // namespace genbridge::ref
