#pragma once
// Bit-exact scalar codecs for the 16-bit float formats (DESIGN §7), plus bulk conversions.
// Encoders round to nearest, ties to even; NaN stays NaN (quiet); fp16 overflows to infinity.

#include <bit>
#include <cstddef>
#include <cstdint>

namespace genbridge {

struct bf16_t {
  uint16_t bits;
};
struct fp16_t {
  uint16_t bits;
};

inline float bf16_to_float(bf16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h.bits) << 16); }

inline bf16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

inline float fp16_to_float(fp16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24 is exact in fp32.
  const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
}

inline fp16_t float_to_fp16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return fp16_t{static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // NaN
  if (a >= 0x477ff000u) return fp16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65536: inf
  if (a >= 0x38800000u) {  // normal fp16 range (>= 2^-14)
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return fp16_t{static_cast<uint16_t>(sign | (r >> 13))};
  }
  // Subnormal or zero: value = a_float; quantum 2^-24. Round mantissa with RNE via integer shift.
  const uint32_t exp = a >> 23;
  if (exp < 102) return fp16_t{sign};  // < 2^-25: rounds to zero (2^-25 exactly is a tie to 0)
  const uint32_t man = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exp;  // value = man * 2^(exp-150); in units of 2^-24: man >> (126-exp)
  uint32_t q = man >> shift;
  const uint32_t rem = man & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return fp16_t{static_cast<uint16_t>(sign | q)};
}

// Bulk conversions (vectorized where the CPU allows; identical results to the scalar codecs).
void bf16_to_float_n(const bf16_t* src, float* dst, size_t n);
void float_to_bf16_n(const float* src, bf16_t* dst, size_t n);
void fp16_to_float_n(const fp16_t* src, float* dst, size_t n);
void float_to_fp16_n(const float* src, fp16_t* dst, size_t n);

}  // namespace genbridge
