// fp16 / bf16 codecs: exhaustive decode against the format definition, RNE at every midpoint,
// and the bulk conversions against the scalar codec.
#include "genbridge/core/formats.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace genbridge {
namespace {

// Value of a binary16 code, from the IEEE 754 definition.
double fp16_definition(uint16_t code) {
  const int sign = code >> 15, e = (code >> 10) & 0x1f, m = code & 0x3ff;
  const double s = sign ? -1.0 : 1.0;
  if (e == 0x1f) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (e == 0) return s * std::ldexp(m, -24);
  return s * std::ldexp(1.0 + m / 1024.0, e - 15);
}

// Value of a bfloat16 code: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double bf16_definition(uint16_t code) {
  const int sign = code >> 15, e = (code >> 7) & 0xff, m = code & 0x7f;
  const double s = sign ? -1.0 : 1.0;
  if (e == 0xff) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (e == 0) return s * std::ldexp(m, -133);
  return s * std::ldexp(1.0 + m / 128.0, e - 127);
}

bool same_value(double want, float got) {
  if (std::isnan(want)) return std::isnan(got);
  return static_cast<double>(got) == want && std::signbit(want) == std::signbit(got);
}

TEST(Fp16, decode_every_code_matches_definition) {
  for (uint32_t c = 0; c < 65536; ++c) {
    ASSERT_TRUE(same_value(fp16_definition(static_cast<uint16_t>(c)), fp16_to_float(fp16_t{static_cast<uint16_t>(c)})))
        << "code 0x" << std::hex << c;
  }
}

TEST(Bf16, decode_every_code_matches_definition) {
  for (uint32_t c = 0; c < 65536; ++c) {
    ASSERT_TRUE(same_value(bf16_definition(static_cast<uint16_t>(c)), bf16_to_float(bf16_t{static_cast<uint16_t>(c)})))
        << "code 0x" << std::hex << c;
  }
}

TEST(Fp16, every_finite_value_round_trips) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const fp16_t h{static_cast<uint16_t>(c)};
    if (((c >> 10) & 0x1f) == 0x1f) continue;
    ASSERT_EQ(float_to_fp16(fp16_to_float(h)).bits, h.bits) << std::hex << c;
  }
}

TEST(Bf16, every_finite_value_round_trips) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const bf16_t h{static_cast<uint16_t>(c)};
    if (((c >> 7) & 0xff) == 0xff) continue;
    ASSERT_EQ(float_to_bf16(bf16_to_float(h)).bits, h.bits) << std::hex << c;
  }
}

// For adjacent positive codes c, c+1 the exact midpoint rounds to the even code, and the fp32 values
// just either side of it round to the nearer code. Negative codes mirror this.
template <typename H, typename Dec, typename Enc>
void check_midpoints(uint32_t max_finite_code, Dec dec, Enc enc) {
  for (uint32_t c = 0; c < max_finite_code; ++c) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const float a = dec(H{static_cast<uint16_t>(c | sign)});
      const float b = dec(H{static_cast<uint16_t>((c + 1) | sign)});
      const float mid = static_cast<float>((static_cast<double>(a) + b) / 2.0);
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + b) / 2.0) << "midpoint not exact in fp32";
      const uint16_t even = (c & 1) ? static_cast<uint16_t>((c + 1) | sign) : static_cast<uint16_t>(c | sign);
      ASSERT_EQ(enc(mid).bits, even) << "midpoint of codes 0x" << std::hex << c << " sign " << sign;
      const float toward_a = std::nextafter(mid, a), toward_b = std::nextafter(mid, b);
      ASSERT_EQ(enc(toward_a).bits, static_cast<uint16_t>(c | sign)) << std::hex << c;
      ASSERT_EQ(enc(toward_b).bits, static_cast<uint16_t>((c + 1) | sign)) << std::hex << c;
    }
  }
}

TEST(Fp16, every_midpoint_rounds_to_even) {
  check_midpoints<fp16_t>(0x7bff, fp16_to_float, float_to_fp16);
}

TEST(Bf16, every_midpoint_rounds_to_even) {
  check_midpoints<bf16_t>(0x7f7f, bf16_to_float, float_to_bf16);
}

TEST(Fp16, overflow_goes_to_infinity_at_the_rounding_boundary) {
  EXPECT_EQ(float_to_fp16(65504.f).bits, 0x7bff);
  EXPECT_EQ(float_to_fp16(std::nextafter(65520.f, 0.f)).bits, 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.f).bits, 0x7c00);
  EXPECT_EQ(float_to_fp16(-1e9f).bits, 0xfc00);
  EXPECT_EQ(float_to_fp16(INFINITY).bits, 0x7c00);
}

TEST(Fp16, underflow_and_signed_zero) {
  EXPECT_EQ(float_to_fp16(std::ldexp(1.f, -25)).bits, 0x0000);  // tie to even (zero)
  EXPECT_EQ(float_to_fp16(std::nextafter(std::ldexp(1.f, -25), 1.f)).bits, 0x0001);
  EXPECT_EQ(float_to_fp16(-0.f).bits, 0x8000);
  EXPECT_EQ(float_to_fp16(1e-30f).bits, 0x0000);
}

TEST(Bf16, nan_stays_nan_and_inf_stays_inf) {
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);  // rounds up past max
}

// Every fp32 bit pattern in a strided sweep, plus special values: bulk == scalar, bit for bit.
std::vector<float> sweep_floats() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  for (float f : {0.f, -0.f, INFINITY, -INFINITY, 65520.f, 65519.f, 1e-8f, -1e-8f}) v.push_back(f);
  v.push_back(std::bit_cast<float>(0x7f800001u));
  v.push_back(std::bit_cast<float>(0xffc12345u));
  return v;
}

TEST(BulkConversion, float_to_bf16_matches_scalar) {
  const auto v = sweep_floats();
  std::vector<bf16_t> out(v.size());
  float_to_bf16_n(v.data(), out.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(out[i].bits, float_to_bf16(v[i]).bits) << std::hex << std::bit_cast<uint32_t>(v[i]);
}

TEST(BulkConversion, float_to_fp16_matches_scalar) {
  const auto v = sweep_floats();
  std::vector<fp16_t> out(v.size());
  float_to_fp16_n(v.data(), out.data(), v.size());
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(out[i].bits, float_to_fp16(v[i]).bits) << std::hex << std::bit_cast<uint32_t>(v[i]);
}

TEST(BulkConversion, decode_every_code_matches_scalar) {
  std::vector<fp16_t> h(65536);
  std::vector<bf16_t> b(65536);
  for (uint32_t c = 0; c < 65536; ++c) h[c].bits = b[c].bits = static_cast<uint16_t>(c);
  std::vector<float> fh(65536), fb(65536);
  fp16_to_float_n(h.data(), fh.data(), h.size());
  bf16_to_float_n(b.data(), fb.data(), b.size());
  for (uint32_t c = 0; c < 65536; ++c) {
    ASSERT_EQ(std::bit_cast<uint32_t>(fh[c]), std::bit_cast<uint32_t>(fp16_to_float(h[c]))) << std::hex << c;
    ASSERT_EQ(std::bit_cast<uint32_t>(fb[c]), std::bit_cast<uint32_t>(bf16_to_float(b[c]))) << std::hex << c;
  }
}

}  // namespace
}  // namespace genbridge
