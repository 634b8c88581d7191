#pragma once
// Internal: 16-lane encoders for the 8-bit and 4-bit formats and int8. Each lane gives exactly what the
// scalar codec in genbridge/core/formats.h gives (saturating mode); tests/core/formats8_test.cpp checks
// that on every code and a dense sweep of fp32 inputs.

#include <bit>
#include <cstdint>
#include <cstring>

#include "core/vec.h"

namespace genbridge::vec {

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef uint64_t u64x8 __attribute__((vector_size(64)));
typedef uint8_t u8x8 __attribute__((vector_size(8)));

inline u32x16 as_u32(f32x16 v) {
  u32x16 u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
inline f32x16 as_f32(u32x16 u) {
  f32x16 v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// Magnitude code of a minifloat with M mantissa bits and exponent bias B, rounding to nearest even and
// saturating at the largest finite magnitude `kMaxBits` (its fp32 bit pattern). `a` holds |x| bits and
// must not be NaN. Two paths, selected per lane:
//   normal:    re-bias the exponent and round the mantissa with the usual add-half-minus-one-plus-lsb
//   subnormal: add 2^(Emin - M + 23), whose ulp is the format's subnormal quantum, so the fp32 adder
//              rounds to the grid (ties to even); the integer difference is the code.
template <int M, int B, uint32_t kMaxBits>
inline u32x16 minifloat_magnitude(u32x16 a) {
  constexpr int kEmin = 1 - B;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(kEmin + 127) << 23;
  constexpr uint32_t kMagicBits = static_cast<uint32_t>(kEmin - M + 23 + 127) << 23;
  constexpr int kShift = 23 - M;
  const u32x16 c = a < kMaxBits ? a : kMaxBits;  // clamp first: rounding of max stays max
  const u32x16 normal = (c - (static_cast<uint32_t>(127 - B) << 23) + ((1u << (kShift - 1)) - 1u) + ((c >> kShift) & 1u)) >> kShift;
  const u32x16 sub = as_u32(as_f32(c) + std::bit_cast<float>(kMagicBits)) - kMagicBits;
  return c < kMinNormalBits ? sub : normal;
}

// fp8 e4m3fn codes (low 8 bits of each lane); NaN -> S.1111.111, +-inf and overflow -> +-448.
inline u32x16 encode_fp8_e4m3fn(f32x16 v) {
  const u32x16 u = as_u32(v);
  const u32x16 a = u & 0x7fffffffu;
  const u32x16 sign = (u >> 24) & 0x80u;
  const u32x16 mag = minifloat_magnitude<3, 7, 0x43e00000u>(a);  // 448
  return sign | (a > 0x7f800000u ? u32x16{} + 0x7fu : mag);
}

// fp8 e5m2 codes; NaN -> S.11111.10, +-inf and overflow -> +-57344.
inline u32x16 encode_fp8_e5m2(f32x16 v) {
  const u32x16 u = as_u32(v);
  const u32x16 a = u & 0x7fffffffu;
  const u32x16 sign = (u >> 24) & 0x80u;
  const u32x16 mag = minifloat_magnitude<2, 15, 0x47600000u>(a);  // 57344
  return sign | (a > 0x7f800000u ? u32x16{} + 0x7eu : mag);
}

// fp4 e2m1 nibbles; NaN -> +0, +-inf and overflow -> +-6.
inline u32x16 encode_fp4_e2m1(f32x16 v) {
  const u32x16 u = as_u32(v);
  const u32x16 a = u & 0x7fffffffu;
  const u32x16 sign = (u >> 28) & 0x8u;
  const u32x16 mag = minifloat_magnitude<1, 1, 0x40c00000u>(a);  // 6
  return a > 0x7f800000u ? u32x16{} : (sign | mag);
}

// int8 values of already-divided lanes: RNE, clamp to +-127, NaN -> 0 (as int32 lanes).
inline i32x16 encode_int8(f32x16 t) {
  const f32x16 hi = splat(127.f), lo = splat(-127.f);
  f32x16 c = t > hi ? hi : t;
  c = c < lo ? lo : c;
  const f32x16 r = c + 12582912.f;  // 1.5 * 2^23: the adder rounds |c| <= 127 to an integer, ties to even
  const i32x16 q = std::bit_cast<i32x16>(as_u32(r) - 0x4b400000u);
  return t == t ? q : i32x16{};
}

// Stores the low byte of each lane.
inline void store_bytes(uint8_t* p, u32x16 codes) {
  const u8x16 b = __builtin_convertvector(codes, u8x16);
  std::memcpy(p, &b, sizeof b);
}
inline void store_bytes(int8_t* p, i32x16 codes) {
  const i8x16 b = __builtin_convertvector(codes, i8x16);
  std::memcpy(p, &b, sizeof b);
}

// Packs 16 nibbles into 8 bytes, lane 2i in the low nibble of byte i.
inline void store_nibble_pairs(uint8_t* p, u32x16 nibbles) {
  u64x8 w;
  std::memcpy(&w, &nibbles, sizeof w);  // lane pair (2i, 2i+1) = low / high half of word i
  const u64x8 packed = (w & 0xfu) | ((w >> 28) & 0xf0u);
  const u8x8 b = __builtin_convertvector(packed, u8x8);
  std::memcpy(p, &b, sizeof b);
}

}  // namespace genbridge::vec
