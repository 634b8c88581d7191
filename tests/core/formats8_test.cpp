// 8-bit and 4-bit codecs (fp8 e4m3fn, fp8 e5m2, e8m0, fp4 e2m1) and int8: every code decodes to the
// value its format definition gives (computed here, not by the codec); every representable value
// round-trips; every midpoint rounds to even; overflow, signed zero, NaN and infinity follow the rules
// documented in formats.h; a definition-based encoder agrees with the codec on a dense fp32 sweep; and
// the vectorized bulk conversions agree with the scalar codec on every code and on that sweep, under every
// CPU target the machine offers (core/simd/formats8-inl.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "genbridge/core/formats.h"

#include "support/each_cpu_target.h"

namespace genbridge {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A minifloat format as its definition states it.
struct Format {
  const char* name;
  int e_bits, m_bits, bias;
  enum Specials { kNone, kFnNaNOnly, kIeee } specials;
  int bits() const { return 1 + e_bits + m_bits; }
  uint32_t sign_bit() const { return 1u << (e_bits + m_bits); }
};
void PrintTo(const Format& f, std::ostream* os) { *os << f.name; }

constexpr Format kE4M3FN{"fp8_e4m3fn", 4, 3, 7, Format::kFnNaNOnly};
constexpr Format kE5M2{"fp8_e5m2", 5, 2, 15, Format::kIeee};
constexpr Format kE2M1{"fp4_e2m1", 2, 1, 1, Format::kNone};

// Value of `code` from the definition: (-1)^s * 2^(1-bias) * (0.m) for e = 0, (-1)^s * 2^(e-bias) * (1.m)
// otherwise; e4m3fn reserves only S.1111.111 for NaN; e5m2 reserves the top exponent as IEEE does.
double definition(const Format& f, uint32_t code) {
  const uint32_t s = (code >> (f.e_bits + f.m_bits)) & 1u;
  const uint32_t e = (code >> f.m_bits) & ((1u << f.e_bits) - 1u);
  const uint32_t m = code & ((1u << f.m_bits) - 1u);
  const uint32_t e_all = (1u << f.e_bits) - 1u, m_all = (1u << f.m_bits) - 1u;
  const double sign = s ? -1.0 : 1.0;
  if (f.specials == Format::kFnNaNOnly && e == e_all && m == m_all) return kNaN;
  if (f.specials == Format::kIeee && e == e_all) return m ? kNaN : sign * INFINITY;
  const double frac = static_cast<double>(m) / static_cast<double>(1u << f.m_bits);
  if (e == 0) return sign * std::ldexp(frac, 1 - f.bias);
  return sign * std::ldexp(1.0 + frac, static_cast<int>(e) - f.bias);
}

// Largest finite positive code and the non-negative finite grid (index = code).
uint32_t max_code(const Format& f) {
  uint32_t best = 0;
  for (uint32_t c = 0; c < f.sign_bit(); ++c) {
    if (std::isfinite(definition(f, c))) best = c;
  }
  return best;
}

uint32_t nan_code(const Format& f, bool negative) {
  if (f.specials == Format::kNone) return 0;
  const uint32_t s = negative ? f.sign_bit() : 0u;
  return s | (f.specials == Format::kFnNaNOnly ? 0x7fu : 0x7eu);
}

// The non-negative finite values of a format in code order (increasing), cached per format.
const std::vector<double>& grid(const Format& f) {
  static std::vector<double> cache[3];
  std::vector<double>& g = cache[f.bits() == 4 ? 2 : f.e_bits - 4];
  if (g.empty()) {
    for (uint32_t c = 0; c <= max_code(f); ++c) g.push_back(definition(f, c));
  }
  return g;
}

// Round-to-nearest-even encoder written from the definition: the nearest grid value, ties to the even
// code, with overflow decided against the midpoint between max and the next value of an unbounded grid.
uint32_t definition_encode(const Format& f, float x, bool saturate) {
  const bool neg = std::signbit(x);
  if (std::isnan(x)) return nan_code(f, neg);
  const uint32_t s = neg ? f.sign_bit() : 0u;
  const std::vector<double>& g0 = grid(f);
  const uint32_t top = static_cast<uint32_t>(g0.size() - 1);
  const double a = std::abs(static_cast<double>(x));
  const double vmax = g0[top];
  const uint32_t e_max = (top >> f.m_bits);
  const double next = vmax + std::ldexp(1.0, static_cast<int>(e_max) - f.bias - f.m_bits);
  const double mid_over = (vmax + next) / 2;
  const bool overflows = std::isinf(a) || a > mid_over || (a == mid_over && (top & 1u));
  if (overflows) {
    if (saturate || f.specials == Format::kNone) return s | top;
    return f.specials == Format::kIeee ? (s | (top + 1)) : (s | 0x7fu);
  }
  if (a >= vmax) return s | top;
  const std::vector<double>& g = g0;
  const uint32_t lo = static_cast<uint32_t>(std::upper_bound(g.begin(), g.end(), a) - g.begin()) - 1;  // g[lo] <= a
  const double dl = a - g[lo], dh = g[lo + 1] - a;
  if (dl < dh) return s | lo;
  if (dh < dl) return s | (lo + 1);
  return s | ((lo & 1u) ? lo + 1 : lo);
}

uint32_t codec_encode(const Format& f, float x, bool saturate) {
  const Overflow o = saturate ? Overflow::kSaturate : Overflow::kNonFinite;
  if (f.bits() == 4) return float_to_fp4_e2m1(x);
  if (f.e_bits == 4) return float_to_fp8_e4m3fn(x, o).bits;
  return float_to_fp8_e5m2(x, o).bits;
}

float codec_decode(const Format& f, uint32_t code) {
  if (f.bits() == 4) return fp4_e2m1_to_float(static_cast<uint8_t>(code));
  if (f.e_bits == 4) return fp8_e4m3fn_to_float(fp8_e4m3fn_t{static_cast<uint8_t>(code)});
  return fp8_e5m2_to_float(fp8_e5m2_t{static_cast<uint8_t>(code)});
}

bool same_value(double want, float got) {
  if (std::isnan(want)) return std::isnan(got);
  return static_cast<double>(got) == want && std::signbit(want) == std::signbit(got);
}

std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
}

// fp32 inputs: a strided sweep over every bit pattern (both signs, all exponents), plus the values the
// rules single out.
std::vector<float> sweep_floats() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 1021) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  for (float f : {0.f, -0.f, INFINITY, -INFINITY, 448.f, 464.f, 480.f, 57344.f, 61440.f, 65536.f, 6.f, 7.f, 8.f,
                  std::nextafter(464.f, 0.f), std::nextafter(464.f, 1e9f), std::nextafter(61440.f, 0.f),
                  std::ldexp(1.f, -10), std::ldexp(1.f, -17), std::ldexp(3.f, -11), 0.25f, -0.75f, 127.5f,
                  -127.5f, 126.5f, 0.5f, -0.5f, 1.5f, 2.5f}) {
    v.push_back(f);
  }
  v.push_back(std::bit_cast<float>(0x7f800001u));  // signalling NaN
  v.push_back(std::bit_cast<float>(0xffc00000u));  // negative quiet NaN
  v.push_back(std::bit_cast<float>(0x00000001u));  // smallest fp32 subnormal
  return v;
}

const std::vector<float>& sweep() {
  static const std::vector<float> v = sweep_floats();
  return v;
}

class Minifloat : public ::testing::TestWithParam<Format> {};

TEST_P(Minifloat, decode_every_code_matches_definition) {
  const Format f = GetParam();
  for (uint32_t c = 0; c < (1u << f.bits()); ++c) {
    ASSERT_TRUE(same_value(definition(f, c), codec_decode(f, c))) << f.name << " code " << hex(c);
  }
}

TEST_P(Minifloat, definition_facts) {
  const Format f = GetParam();
  const double vmax = definition(f, max_code(f));
  if (f.e_bits == 4) {
    EXPECT_EQ(vmax, 448.0);
  }
  if (f.e_bits == 5) {
    EXPECT_EQ(vmax, 57344.0);
  }
  if (f.bits() == 4) {
    const double want[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    for (uint32_t c = 0; c < 8; ++c) EXPECT_EQ(definition(f, c), want[c]);
  }
}

TEST_P(Minifloat, every_representable_value_round_trips) {
  const Format f = GetParam();
  for (uint32_t c = 0; c < (1u << f.bits()); ++c) {
    const float v = codec_decode(f, c);
    if (std::isnan(v)) continue;
    if (std::isinf(v)) {
      const uint32_t s = std::signbit(v) ? f.sign_bit() : 0u;
      EXPECT_EQ(codec_encode(f, v, false), c) << f.name << ": infinity keeps its code in IEEE mode";
      EXPECT_EQ(codec_encode(f, v, true), s | max_code(f)) << f.name << ": infinity saturates";
      continue;
    }
    ASSERT_EQ(codec_encode(f, v, true), c) << f.name << " code " << hex(c);
    ASSERT_EQ(codec_encode(f, v, false), c) << f.name << " code " << hex(c);
  }
}

// For adjacent finite codes c, c+1 of either sign, the midpoint rounds to the even code and the fp32
// neighbours of the midpoint round to the nearer code.
TEST_P(Minifloat, every_midpoint_rounds_to_even) {
  const Format f = GetParam();
  for (uint32_t c = 0; c < max_code(f); ++c) {
    for (uint32_t s : {0u, f.sign_bit()}) {
      const double a = definition(f, c | s), b = definition(f, (c + 1) | s);
      const float mid = static_cast<float>((a + b) / 2);
      ASSERT_EQ(static_cast<double>(mid), (a + b) / 2) << "midpoint not exact in fp32";
      const uint32_t even = (c & 1u) ? (c + 1) : c;
      for (bool sat : {true, false}) {
        ASSERT_EQ(codec_encode(f, mid, sat), even | s) << f.name << " midpoint of " << hex(c) << " sign " << s;
        ASSERT_EQ(codec_encode(f, std::nextafter(mid, static_cast<float>(a)), sat), c | s) << f.name << " " << hex(c);
        ASSERT_EQ(codec_encode(f, std::nextafter(mid, static_cast<float>(b)), sat), (c + 1) | s) << f.name << " " << hex(c);
      }
    }
  }
}

TEST_P(Minifloat, signed_zero_nan_and_infinity) {
  const Format f = GetParam();
  for (bool sat : {true, false}) {
    EXPECT_EQ(codec_encode(f, 0.f, sat), 0u);
    EXPECT_EQ(codec_encode(f, -0.f, sat), f.sign_bit()) << "-0 keeps its sign";
    EXPECT_EQ(codec_encode(f, std::ldexp(1.f, -60), sat), 0u) << "underflow to +0";
    EXPECT_EQ(codec_encode(f, -std::ldexp(1.f, -60), sat), f.sign_bit()) << "underflow to -0";
    EXPECT_EQ(codec_encode(f, std::numeric_limits<float>::quiet_NaN(), sat), nan_code(f, false));
    EXPECT_EQ(codec_encode(f, -std::numeric_limits<float>::quiet_NaN(), sat), nan_code(f, true));
    EXPECT_EQ(codec_encode(f, std::bit_cast<float>(0x7f800001u), sat), nan_code(f, false)) << "signalling NaN";
  }
  EXPECT_EQ(codec_encode(f, INFINITY, true), max_code(f));
  EXPECT_EQ(codec_encode(f, -INFINITY, true), f.sign_bit() | max_code(f));
}

// The codec equals the definition-based encoder on every swept fp32 value, in both overflow modes.
TEST_P(Minifloat, encode_matches_definition_on_dense_sweep) {
  const Format f = GetParam();
  for (float x : sweep()) {
    for (bool sat : {true, false}) {
      if (f.bits() == 4 && !sat) continue;  // fp4 always saturates
      ASSERT_EQ(codec_encode(f, x, sat), definition_encode(f, x, sat))
          << f.name << " x=" << x << " bits " << hex(std::bit_cast<uint32_t>(x)) << " saturate=" << sat;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(formats, Minifloat, ::testing::Values(kE4M3FN, kE5M2, kE2M1),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- overflow boundaries, spelled out ----

TEST(Fp8E4M3FN, saturates_to_448_and_never_produces_nan_from_a_number) {
  EXPECT_EQ(float_to_fp8_e4m3fn(448.f).bits, 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3fn(464.f).bits, 0x7e);  // tie between 448 (even) and 480: even
  EXPECT_EQ(float_to_fp8_e4m3fn(std::nextafter(464.f, 1e9f)).bits, 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3fn(1e30f).bits, 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3fn(-1e30f).bits, 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3fn(INFINITY).bits, 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3fn(std::nextafter(464.f, 1e9f), Overflow::kNonFinite).bits, 0x7f);
  EXPECT_EQ(float_to_fp8_e4m3fn(464.f, Overflow::kNonFinite).bits, 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3fn(-INFINITY, Overflow::kNonFinite).bits, 0xff);
}

TEST(Fp8E5M2, overflow_saturates_by_default_and_goes_to_infinity_in_ieee_mode) {
  EXPECT_EQ(float_to_fp8_e5m2(57344.f).bits, 0x7b);
  EXPECT_EQ(float_to_fp8_e5m2(std::nextafter(61440.f, 0.f)).bits, 0x7b);
  EXPECT_EQ(float_to_fp8_e5m2(61440.f).bits, 0x7b);  // saturating: the tie would go to 65536
  EXPECT_EQ(float_to_fp8_e5m2(INFINITY).bits, 0x7b);
  EXPECT_EQ(float_to_fp8_e5m2(-INFINITY).bits, 0xfb);
  EXPECT_EQ(float_to_fp8_e5m2(std::nextafter(61440.f, 0.f), Overflow::kNonFinite).bits, 0x7b);
  EXPECT_EQ(float_to_fp8_e5m2(61440.f, Overflow::kNonFinite).bits, 0x7c);  // tie to even: 65536 = inf
  EXPECT_EQ(float_to_fp8_e5m2(-INFINITY, Overflow::kNonFinite).bits, 0xfc);
}

TEST(Fp4E2M1, saturates_to_six_and_encodes_nan_as_zero) {
  EXPECT_EQ(float_to_fp4_e2m1(6.f), 0x7);
  EXPECT_EQ(float_to_fp4_e2m1(7.f), 0x7);
  EXPECT_EQ(float_to_fp4_e2m1(-100.f), 0xf);
  EXPECT_EQ(float_to_fp4_e2m1(0.25f), 0x0);   // tie between 0 and 0.5: even (0)
  EXPECT_EQ(float_to_fp4_e2m1(0.75f), 0x2);   // tie between 0.5 and 1: even (1.0 = 0b010)
  EXPECT_EQ(float_to_fp4_e2m1(5.f), 0x6);     // tie between 4 and 6: even (4 = 0b110)
  EXPECT_EQ(float_to_fp4_e2m1(std::numeric_limits<float>::quiet_NaN()), 0x0);
  EXPECT_EQ(pack_fp4_e2m1x2(0x1, 0xf), 0xf1);
}

// ---- e8m0 ----

TEST(E8M0, decode_every_code_matches_definition) {
  for (uint32_t c = 0; c < 256; ++c) {
    const double want = c == 0xff ? kNaN : std::ldexp(1.0, static_cast<int>(c) - 127);
    ASSERT_TRUE(same_value(want, e8m0_to_float(e8m0_t{static_cast<uint8_t>(c)}))) << "code " << c;
  }
  EXPECT_EQ(e8m0_to_float(e8m0_t{127}), 1.0f);
  EXPECT_EQ(e8m0_to_float(e8m0_t{0}), std::ldexp(1.0f, -127));  // an fp32 subnormal, still exact
}

// ---- int8 ----

int8_t int8_definition(float x) {
  if (std::isnan(x)) return 0;
  const double r = std::nearbyint(static_cast<double>(x));  // default mode: nearest, ties to even
  return static_cast<int8_t>(std::clamp(r, -127.0, 127.0));
}

TEST(Int8, round_to_nearest_even_and_clamp_to_127) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  for (float x : sweep()) ASSERT_EQ(float_to_int8(x), int8_definition(x)) << x;
  for (int k = -130; k <= 130; ++k) {
    const float h = static_cast<float>(k) + 0.5f;
    ASSERT_EQ(float_to_int8(h), int8_definition(h)) << h;
    ASSERT_EQ(float_to_int8(std::nextafter(h, 0.f)), int8_definition(std::nextafter(h, 0.f))) << h;
  }
  EXPECT_EQ(float_to_int8(2.5f), 2);
  EXPECT_EQ(float_to_int8(-2.5f), -2);
  EXPECT_EQ(float_to_int8(3.5f), 4);
  EXPECT_EQ(float_to_int8(-128.f), -127);
  EXPECT_EQ(float_to_int8(INFINITY), 127);
  EXPECT_EQ(float_to_int8(-INFINITY), -127);
}

// ---- bulk conversions against the scalar codec ----

const float kMuls[] = {1.0f, 0.0078125f, 256.0f, std::ldexp(1.0f, -127), std::ldexp(1.0f, 100), 0.3f, -1.7f};

// Every code's value and every midpoint (and its neighbours) of a format, plus the sweep.
std::vector<float> grid_points(const Format& f) {
  std::vector<float> v;
  for (uint32_t c = 0; c < (1u << f.bits()); ++c) {
    const double a = definition(f, c);
    v.push_back(static_cast<float>(a));
    if (std::isfinite(a) && (c & (f.sign_bit() - 1)) < max_code(f)) {
      const float mid = static_cast<float>((a + definition(f, c + 1)) / 2);
      for (float m : {mid, std::nextafter(mid, 0.f), std::nextafter(mid, 1e30f), std::nextafter(mid, -1e30f)}) v.push_back(m);
    }
  }
  v.insert(v.end(), sweep().begin(), sweep().end());
  return v;
}

TEST(BulkConversion, float_to_fp8_e4m3fn_matches_scalar) {
  testing::for_each_cpu_target([&](const std::string&) {
    const auto v = grid_points(kE4M3FN);
    std::vector<fp8_e4m3fn_t> out(v.size());
    for (float mul : kMuls) {
      float_to_fp8_e4m3fn_n(v.data(), mul, out.data(), v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(out[i].bits, float_to_fp8_e4m3fn(v[i] * mul).bits) << "x=" << v[i] << " mul=" << mul;
      }
    }
  });
}

TEST(BulkConversion, float_to_fp8_e5m2_matches_scalar) {
  testing::for_each_cpu_target([&](const std::string&) {
    const auto v = grid_points(kE5M2);
    std::vector<fp8_e5m2_t> out(v.size());
    for (float mul : kMuls) {
      float_to_fp8_e5m2_n(v.data(), mul, out.data(), v.size());
      for (size_t i = 0; i < v.size(); ++i) {
        ASSERT_EQ(out[i].bits, float_to_fp8_e5m2(v[i] * mul).bits) << "x=" << v[i] << " mul=" << mul;
      }
    }
  });
}

TEST(BulkConversion, float_to_fp4_e2m1x2_matches_scalar) {
  testing::for_each_cpu_target([&](const std::string&) {
    auto v = grid_points(kE2M1);
    if (v.size() % 2) v.push_back(1.0f);
    std::vector<uint8_t> out(v.size() / 2);
    for (float mul : kMuls) {
      float_to_fp4_e2m1x2_n(v.data(), mul, out.data(), v.size());
      for (size_t i = 0; i < v.size(); i += 2) {
        const uint8_t want = pack_fp4_e2m1x2(float_to_fp4_e2m1(v[i] * mul), float_to_fp4_e2m1(v[i + 1] * mul));
        ASSERT_EQ(out[i / 2], want) << "x=" << v[i] << "," << v[i + 1] << " mul=" << mul;
      }
    }
  });
}

TEST(BulkConversion, float_to_int8_matches_scalar) {
  testing::for_each_cpu_target([&](const std::string&) {
    std::vector<float> v = sweep();
    for (int k = -300; k <= 300; ++k) {
      v.push_back(static_cast<float>(k) * 0.5f);
      v.push_back(std::nextafter(static_cast<float>(k) * 0.5f, 0.f));
    }
    std::vector<int8_t> out(v.size());
    for (float div : {1.0f, 0.0123f, 3.7f, 1e-30f, 1e30f, -2.0f}) {
      float_to_int8_n(v.data(), div, out.data(), v.size());
      for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(out[i], float_to_int8(v[i] / div)) << v[i] << " / " << div;
    }
  });
}

TEST(BulkConversion, decode_every_code_matches_scalar) {
  testing::for_each_cpu_target([&](const std::string&) {
    std::vector<fp8_e4m3fn_t> a(256);
    std::vector<fp8_e5m2_t> b(256);
    std::vector<uint8_t> c(256);
    for (uint32_t i = 0; i < 256; ++i) a[i].bits = b[i].bits = c[i] = static_cast<uint8_t>(i);
    std::vector<float> fa(256), fb(256), fc(512);
    for (float mul : kMuls) {
      fp8_e4m3fn_to_float_n(a.data(), mul, fa.data(), 256);
      fp8_e5m2_to_float_n(b.data(), mul, fb.data(), 256);
      fp4_e2m1x2_to_float_n(c.data(), mul, fc.data(), 512);
      for (uint32_t i = 0; i < 256; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(fa[i]), std::bit_cast<uint32_t>(fp8_e4m3fn_to_float(a[i]) * mul)) << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(fb[i]), std::bit_cast<uint32_t>(fp8_e5m2_to_float(b[i]) * mul)) << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(fc[2 * i]), std::bit_cast<uint32_t>(fp4_e2m1_to_float(c[i] & 0xf) * mul)) << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(fc[2 * i + 1]), std::bit_cast<uint32_t>(fp4_e2m1_to_float(c[i] >> 4) * mul)) << i;
      }
    }
  });
}

// Tails and misaligned pointers: every length 0..40 from an odd offset.
TEST(BulkConversion, every_length_and_offset) {
  testing::for_each_cpu_target([&](const std::string&) {
    std::vector<float> v(64);
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::ldexp(static_cast<float>(i) - 31.3f, static_cast<int>(i % 9) - 4);
    for (size_t n = 0; n <= 40; n += 1) {
      std::vector<fp8_e4m3fn_t> o(n + 2, fp8_e4m3fn_t{0xaa});
      float_to_fp8_e4m3fn_n(v.data() + 3, 1.0f, o.data() + 1, n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(o[i + 1].bits, float_to_fp8_e4m3fn(v[i + 3]).bits);
      EXPECT_EQ(o[0].bits, 0xaa);
      EXPECT_EQ(o[n + 1].bits, 0xaa) << "wrote past the end for n=" << n;
      std::vector<int8_t> q(n + 1, 0x55);
      float_to_int8_n(v.data() + 1, 0.25f, q.data(), n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(q[i], float_to_int8(v[i + 1] / 0.25f));
      EXPECT_EQ(q[n], 0x55);
    }
  });
}

}  // namespace
}  // namespace genbridge
