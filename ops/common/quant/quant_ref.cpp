#include "ops/common/quant/quant_ref.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

namespace genbridge::ref {
namespace {

struct Grid {
  int e_bits, m_bits, bias;
  uint32_t max_code;  // largest finite positive code
  uint8_t nan_code;   // positive NaN code (fp4: 0, it has none)
};

Grid grid_of(DType dst) {
  switch (dst) {
    case DType::kFp8E4M3FN: return {4, 3, 7, 0x7e, 0x7f};
    case DType::kFp8E5M2: return {5, 2, 15, 0x7b, 0x7e};
    default: return {2, 1, 1, 0x7, 0x0};
  }
}

// (-1)^s 2^(1-bias) 0.m for e = 0, (-1)^s 2^(e-bias) 1.m otherwise (special codes handled by callers).
double minifloat(const Grid& g, uint32_t code) {
  const uint32_t s = (code >> (g.e_bits + g.m_bits)) & 1u;
  const uint32_t e = (code >> g.m_bits) & ((1u << g.e_bits) - 1u);
  const double m = static_cast<double>(code & ((1u << g.m_bits) - 1u)) / static_cast<double>(1u << g.m_bits);
  const double mag = e == 0 ? std::ldexp(m, 1 - g.bias) : std::ldexp(1.0 + m, static_cast<int>(e) - g.bias);
  return s ? -mag : mag;
}

// Non-negative finite values of dst in code order (increasing).
const std::vector<double>& positive_values(DType dst) {
  static const auto make = [](DType d) {
    const Grid g = grid_of(d);
    std::vector<double> v;
    for (uint32_t c = 0; c <= g.max_code; ++c) v.push_back(minifloat(g, c));
    return v;
  };
  static const std::vector<double> e4m3 = make(DType::kFp8E4M3FN), e5m2 = make(DType::kFp8E5M2),
                                   e2m1 = make(DType::kFp4E2M1x2);
  return dst == DType::kFp8E4M3FN ? e4m3 : (dst == DType::kFp8E5M2 ? e5m2 : e2m1);
}

int floor_log2(double a) {  // a > 0, finite
  int e;
  std::frexp(a, &e);  // a = f * 2^e with f in [0.5, 1)
  return e - 1;
}

}  // namespace

double mx_max(DType dst) { return minifloat(grid_of(dst), grid_of(dst).max_code); }
int mx_emax(DType dst) { return floor_log2(mx_max(dst)); }

double mx_element_value(DType dst, uint8_t code) {
  const Grid g = grid_of(dst);
  if (dst == DType::kFp4E2M1x2) return minifloat(g, code & 0xfu);
  if (dst == DType::kFp8E4M3FN && (code & 0x7f) == 0x7f) return std::numeric_limits<double>::quiet_NaN();
  if (dst == DType::kFp8E5M2 && ((code >> 2) & 0x1f) == 0x1f) {
    return (code & 3) ? std::numeric_limits<double>::quiet_NaN() : ((code & 0x80) ? -INFINITY : INFINITY);
  }
  return minifloat(g, code);
}

uint8_t mx_encode(DType dst, double v) {
  const Grid g = grid_of(dst);
  if (std::isnan(v)) return g.nan_code;
  const uint32_t sign = std::signbit(v) ? (1u << (g.e_bits + g.m_bits)) : 0u;
  const double a = std::abs(v);
  const std::vector<double>& values = positive_values(dst);
  if (a >= values.back()) return static_cast<uint8_t>(sign | g.max_code);  // saturate
  // Largest code whose value is <= a; a < max, so lo + 1 exists.
  const uint32_t lo = static_cast<uint32_t>(std::upper_bound(values.begin(), values.end(), a) - values.begin()) - 1;
  const double dl = a - values[lo], dh = values[lo + 1] - a;
  const uint32_t code = dl < dh ? lo : (dh < dl ? lo + 1 : ((lo & 1u) ? lo + 1 : lo));
  return static_cast<uint8_t>(sign | code);
}

uint8_t mx_scale_byte(double amax, DType dst, ops::MxScaleAlg alg, bool round_scale) {
  if (!std::isfinite(amax)) return 0xff;
  const double vmax = mx_max(dst);
  int s = 0;
  switch (alg) {
    case ops::MxScaleAlg::kOcpFloor:
      s = amax == 0 ? -1000 : floor_log2(amax) - mx_emax(dst);
      break;
    case ops::MxScaleAlg::kCeil:
      if (amax == 0) {
        s = -1000;
      } else {
        s = floor_log2(amax) - mx_emax(dst) - 1;  // too small by construction; step up until it fits
        while (amax / std::ldexp(1.0, s) > vmax) ++s;
      }
      break;
    case ops::MxScaleAlg::kBiasedExponent: {
      // fp32 arithmetic as the rule states it: both operands are fp32 values, their exact product
      // (exact in fp64) rounded once to fp32 is the fp32 product.
      const float a = std::max(static_cast<float>(amax), ops::kMxBiasedExponentAmaxFloor);
      const float inv = static_cast<float>(1.0 / vmax);
      const float p = static_cast<float>(static_cast<double>(a) * static_cast<double>(inv));
      s = static_cast<int>(std::bit_cast<uint32_t>(p) >> 23) - 127 + (round_scale ? 1 : 0);
      break;
    }
  }
  return static_cast<uint8_t>(std::clamp(s, -127, 127) + 127);
}

void dynamic_mx_quant(const std::vector<double>& x, int64_t rows, int64_t k, const ops::MxQuantConfig& c,
                      std::vector<uint8_t>& q, std::vector<uint8_t>& scale) {
  const bool fp4 = c.dst == DType::kFp4E2M1x2;
  const int64_t nb = ops::mx_num_blocks(k, c.block_size), pairs = ops::mx_scale_pairs(k, c.block_size);
  q.assign(static_cast<size_t>(rows * (fp4 ? k / 2 : k)), 0);
  scale.assign(static_cast<size_t>(rows * pairs * 2), 0);
  std::vector<uint8_t> codes(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * k;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t lo = b * c.block_size, hi = std::min(k, lo + c.block_size);
      double amax = 0;  // NaN if the block holds one
      for (int64_t i = lo; i < hi; ++i) {
        const double a = std::abs(xr[i]);
        if (std::isnan(a)) {
          amax = a;
          break;
        }
        amax = std::max(amax, a);
      }
      const uint8_t sb = mx_scale_byte(amax, c.dst, c.scale_alg, c.round_scale);
      scale[static_cast<size_t>(r * pairs * 2 + b)] = sb;
      for (int64_t i = lo; i < hi; ++i) {
        codes[static_cast<size_t>(i)] =
            sb == 0xff ? grid_of(c.dst).nan_code : mx_encode(c.dst, std::ldexp(xr[i], 127 - static_cast<int>(sb)));
      }
    }
    for (int64_t i = 0; i < k; ++i) {
      if (fp4) {
        q[static_cast<size_t>(r * (k / 2) + i / 2)] |= static_cast<uint8_t>(codes[i] << (4 * (i % 2)));
      } else {
        q[static_cast<size_t>(r * k + i)] = codes[i];
      }
    }
  }
}

void mx_dequant(const std::vector<uint8_t>& q, const std::vector<uint8_t>& scale, int64_t rows, int64_t k,
                int64_t block_size, DType q_dtype, std::vector<double>& y) {
  const bool fp4 = q_dtype == DType::kFp4E2M1x2;
  const int64_t pairs = ops::mx_scale_pairs(k, block_size);
  y.assign(static_cast<size_t>(rows * k), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      const uint8_t sb = scale[static_cast<size_t>(r * pairs * 2 + i / block_size)];
      const uint8_t code = fp4 ? static_cast<uint8_t>(q[static_cast<size_t>(r * (k / 2) + i / 2)] >> (4 * (i % 2)))
                               : q[static_cast<size_t>(r * k + i)];
      const double v = mx_element_value(q_dtype, code);
      double out;
      if (sb == 0xff || std::isnan(v)) {
        out = std::numeric_limits<double>::quiet_NaN();
      } else {
        // The fp32 product, rounded once; at or past the midpoint between FLT_MAX and 2^128 it is inf.
        const double p = std::ldexp(v, static_cast<int>(sb) - 127);
        const double overflow = std::ldexp(2.0 - std::ldexp(1.0, -24), 127);
        out = std::abs(p) >= overflow ? std::copysign(INFINITY, p) : static_cast<double>(static_cast<float>(p));
      }
      y[static_cast<size_t>(r * k + i)] = out;
    }
  }
}

void dynamic_quant_per_token(const std::vector<double>& x, int64_t rows, int64_t k, float eps,
                             std::vector<int8_t>& q, std::vector<float>& scale) {
  q.assign(static_cast<size_t>(rows * k), 0);
  scale.assign(static_cast<size_t>(rows), 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    double amax = 0;
    bool nan = false;
    for (int64_t i = 0; i < k; ++i) {
      nan = nan || std::isnan(x[r * k + i]);
      amax = std::max(amax, std::abs(x[r * k + i]));
    }
    // The quotient of two fp32 values computed in fp64 and rounded to fp32 is the fp32 quotient.
    const float s = nan ? std::numeric_limits<float>::quiet_NaN()
                        : static_cast<float>(std::max(amax, static_cast<double>(eps)) / 127.0);
    scale[r] = s;
    for (int64_t i = 0; i < k; ++i) {
      const double t = static_cast<float>(x[r * k + i] / static_cast<double>(s));
      int8_t v = 0;
      if (!std::isnan(t)) v = static_cast<int8_t>(std::clamp(std::nearbyint(t), -127.0, 127.0));
      q[r * k + i] = v;
    }
  }
}

}  // namespace genbridge::ref
