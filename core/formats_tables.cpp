// Decode tables of the 8-bit formats, built at compile time from the format definitions. They are
// constant-initialised: a decode from another translation unit's static initialiser sees the values.
#include <array>
#include <bit>
#include <limits>

#include "genbridge/core/formats.h"

namespace genbridge::detail {
namespace {

// 2^e as fp32 for e in [-149, 127] (subnormal below -126).
constexpr float pow2f(int e) {
  return e >= -126 ? std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23)
                   : std::bit_cast<float>(uint32_t{1} << (e + 149));
}

// Value of an IEEE-like minifloat code with E exponent bits and M mantissa bits (no special values):
// subnormal m * 2^(1-bias-M), normal (2^M + m) * 2^(e-bias-M). Both products are exact in fp32.
constexpr float minifloat_value(uint32_t code, int e_bits, int m_bits, int bias) {
  const uint32_t sign = (code >> (e_bits + m_bits)) & 1u;
  const uint32_t ef = (code >> m_bits) & ((1u << e_bits) - 1u);
  const uint32_t mf = code & ((1u << m_bits) - 1u);
  const float mag = ef == 0 ? static_cast<float>(mf) * pow2f(1 - bias - m_bits)
                            : static_cast<float>((1u << m_bits) + mf) * pow2f(static_cast<int>(ef) - bias - m_bits);
  return sign ? -mag : mag;
}

constexpr std::array<float, 256> make_e4m3fn() {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) {
    t[c] = (c & 0x7f) == 0x7f ? std::numeric_limits<float>::quiet_NaN() : minifloat_value(c, 4, 3, 7);
  }
  return t;
}

constexpr std::array<float, 256> make_e5m2() {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) {
    const uint32_t ef = (c >> 2) & 0x1f, mf = c & 3;
    if (ef == 0x1f) {
      const float inf = std::numeric_limits<float>::infinity();
      t[c] = mf ? std::numeric_limits<float>::quiet_NaN() : ((c & 0x80) ? -inf : inf);
    } else {
      t[c] = minifloat_value(c, 5, 2, 15);
    }
  }
  return t;
}

constexpr std::array<float, 256> make_e8m0() {
  std::array<float, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) {
    t[c] = c == 0xff ? std::numeric_limits<float>::quiet_NaN() : pow2f(static_cast<int>(c) - 127);
  }
  return t;
}

alignas(64) constexpr std::array<float, 256> kE4M3FN = make_e4m3fn();
alignas(64) constexpr std::array<float, 256> kE5M2 = make_e5m2();
alignas(64) constexpr std::array<float, 256> kE8M0 = make_e8m0();

}  // namespace

alignas(64) const float kFp4E2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                              -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

const float* fp8_e4m3fn_decode_table() { return kE4M3FN.data(); }
const float* fp8_e5m2_decode_table() { return kE5M2.data(); }
const float* e8m0_decode_table() { return kE8M0.data(); }

}  // namespace genbridge::detail
