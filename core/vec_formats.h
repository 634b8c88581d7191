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
typedef uint8_t u8x64 __attribute__((vector_size(64)));
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
  // Clamp first (rounding max stays max). Signed compare: `a` has no sign bit, and the signed form
  // lowers to fewer instructions than the unsigned one.
  const i32x16 ai = std::bit_cast<i32x16>(a);
  const u32x16 c = std::bit_cast<u32x16>(ai < static_cast<int32_t>(kMaxBits) ? ai : static_cast<int32_t>(kMaxBits));
  const u32x16 normal = (c - (static_cast<uint32_t>(127 - B) << 23) + ((1u << (kShift - 1)) - 1u) + ((c >> kShift) & 1u)) >> kShift;
  const u32x16 sub = as_u32(as_f32(c) + std::bit_cast<float>(kMagicBits)) - kMagicBits;
  return c < kMinNormalBits ? sub : normal;
}

// Finite-input encoders for the MX kernels, whose NaN/inf blocks never reach an encoder: the same
// codes as below for every finite lane, without the NaN select.
inline u32x16 encode_fp8_e4m3fn_finite(f32x16 v) {
  const u32x16 u = as_u32(v);
  return ((u >> 24) & 0x80u) | minifloat_magnitude<3, 7, 0x43e00000u>(u & 0x7fffffffu);
}
inline u32x16 encode_fp8_e5m2_finite(f32x16 v) {
  const u32x16 u = as_u32(v);
  return ((u >> 24) & 0x80u) | minifloat_magnitude<2, 15, 0x47600000u>(u & 0x7fffffffu);
}
inline u32x16 encode_fp4_e2m1_finite(f32x16 v) {
  const u32x16 u = as_u32(v);
  return ((u >> 28) & 0x8u) | minifloat_magnitude<1, 1, 0x40c00000u>(u & 0x7fffffffu);
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

// Stores the low byte of each lane. A byte shuffle rather than __builtin_convertvector, which GCC 12
// lowers to per-lane extracts; the shuffle becomes one permute (vpermb where available).
inline void store_bytes(uint8_t* p, u32x16 codes) {
  u8x64 b;
  std::memcpy(&b, &codes, sizeof b);
  const u8x16 r = __builtin_shufflevector(b, b, 0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
  std::memcpy(p, &r, sizeof r);
}
inline void store_bytes(int8_t* p, i32x16 codes) {
  store_bytes(reinterpret_cast<uint8_t*>(p), std::bit_cast<u32x16>(codes));
}

// Packs 16 nibbles into 8 bytes, lane 2i in the low nibble of byte i.
inline void store_nibble_pairs(uint8_t* p, u32x16 nibbles) {
  u64x8 w;
  std::memcpy(&w, &nibbles, sizeof w);  // lane pair (2i, 2i+1) = low / high half of word i
  const u64x8 packed = (w & 0xfu) | ((w >> 28) & 0xf0u);
  u8x64 b;
  std::memcpy(&b, &packed, sizeof b);
  const u8x8 r = __builtin_shufflevector(b, b, 0, 8, 16, 24, 32, 40, 48, 56);
  std::memcpy(p, &r, sizeof r);
}

// 32 consecutive values as two fp32 vectors (values 0-15, 16-31). bf16 widens by interleaving a zero
// half-word below each value: one two-source shuffle per output vector instead of zero-extend + shift.
inline void load32(const float* p, f32x16& lo, f32x16& hi) {
  lo = load(p);
  hi = load(p + 16);
}
inline void load32(const fp16_t* p, f32x16& lo, f32x16& hi) {
  lo = load(p);
  hi = load(p + 16);
}
inline void load32(const bf16_t* p, f32x16& lo, f32x16& hi) {
  typedef uint16_t u16x32 __attribute__((vector_size(64)));
  u16x32 h;
  std::memcpy(&h, p, sizeof h);
  const u16x32 z{};
  const u16x32 a = __builtin_shufflevector(z, h, 0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39, 8, 40, 9, 41,
                                           10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47);
  const u16x32 b = __builtin_shufflevector(z, h, 16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55, 24,
                                           56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63);
  std::memcpy(&lo, &a, sizeof lo);
  std::memcpy(&hi, &b, sizeof hi);
}

// Low bytes of 32 lanes (lo then hi) as 32 consecutive bytes: one two-source byte shuffle.
inline void store_bytes32(uint8_t* p, u32x16 lo, u32x16 hi) {
  u8x64 a, b;
  std::memcpy(&a, &lo, sizeof a);
  std::memcpy(&b, &hi, sizeof b);
  typedef uint8_t u8x32 __attribute__((vector_size(32)));
  const u8x32 r = __builtin_shufflevector(a, b, 0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 68, 72,
                                          76, 80, 84, 88, 92, 96, 100, 104, 108, 112, 116, 120, 124);
  std::memcpy(p, &r, sizeof r);
}

// 32 nibbles (lo then hi) packed into 16 bytes, nibble 2i low in byte i.
inline void store_nibble_pairs32(uint8_t* p, u32x16 lo, u32x16 hi) {
  u64x8 w0, w1;
  std::memcpy(&w0, &lo, sizeof w0);
  std::memcpy(&w1, &hi, sizeof w1);
  const u64x8 p0 = (w0 & 0xfu) | ((w0 >> 28) & 0xf0u), p1 = (w1 & 0xfu) | ((w1 >> 28) & 0xf0u);
  u8x64 a, b;
  std::memcpy(&a, &p0, sizeof a);
  std::memcpy(&b, &p1, sizeof b);
  const u8x16 r = __builtin_shufflevector(a, b, 0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120);
  std::memcpy(p, &r, sizeof r);
}

// ---- bf16 input, MX scaling: 32 values per 16-bit lane vector ----
// For a bf16 x and a power-of-two scale 2^s, x * 2^-s is exact, so its e4m3fn / e2m1 code can be
// computed on the bf16 bit pattern itself: subtract s from the exponent field, then round the 7-bit
// mantissa to the target's (normal range) or let an fp16 adder round onto the subnormal grid (an fp16
// holds every bf16 value of e4m3fn's and e2m1's subnormal ranges exactly, and magic = 2^(emin - M + 10)
// has that grid's quantum as its ulp). Preconditions: x finite, x * 2^-s finite in fp32, s >= -112 (so
// that bf16 subnormal inputs, misread as normal after the shift, still land below half the smallest
// subnormal and encode as zero, as they should). tests/core/formats8_test.cpp checks every finite bf16
// pattern against the scalar codec for every s in [-112, 127].
// Taken only where fp16 arithmetic is native; elsewhere _Float16 vectors would be emulated slowly.
#if defined(__AVX512FP16__)
inline constexpr bool kNativeFp16 = true;
#else
inline constexpr bool kNativeFp16 = false;
#endif

typedef uint16_t u16x32 __attribute__((vector_size(64)));
typedef int16_t i16x32 __attribute__((vector_size(64)));
#if defined(__aarch64__)
// GCC 12 has no C++ _Float16 on aarch64 (__fp16 is binary16 there); this path is not taken there anyway.
using half16 = __fp16;
#else
using half16 = _Float16;
#endif
typedef half16 h16x32 __attribute__((vector_size(64)));

template <int M, int B, int16_t kMax16, uint16_t kMagic16, int kSignShift, uint16_t kSignMask>
inline u16x32 bf16_scaled_minifloat(u16x32 u, int16_t s_shift /* s << 7 */) {
  constexpr int kShift = 7 - M;
  const u16x32 sign = (u >> kSignShift) & kSignMask;
  // |x| * 2^-s as bf16 bits (normal when >= 0x80). Subtracted in wrapping unsigned arithmetic: only
  // inputs outside the preconditions could wrap, and signed vector overflow would be undefined.
  i16x32 t = std::bit_cast<i16x32>(static_cast<u16x32>(u & 0x7fff) - static_cast<uint16_t>(s_shift));
  t = t < 0 ? 0 : t;
  t = t > kMax16 ? kMax16 : t;  // saturate: rounding max stays max
  const u16x32 tu = std::bit_cast<u16x32>(t);
  const u16x32 normal = (tu - static_cast<uint16_t>((127 - B) << 7) + static_cast<uint16_t>((1 << (kShift - 1)) - 1) +
                         ((tu >> kShift) & 1)) >> kShift;
  const u16x32 fp16_bits = (tu - static_cast<uint16_t>(112 << 7)) << 3;  // same value as fp16 (exponent >= -14)
  h16x32 h;
  std::memcpy(&h, &fp16_bits, sizeof h);
  const h16x32 rounded = h + std::bit_cast<h16x32>(u16x32{} + kMagic16);
  u16x32 sub;
  std::memcpy(&sub, &rounded, sizeof sub);
  sub = sub - kMagic16;
  sub = t < static_cast<int16_t>(113 << 7) ? u16x32{} : sub;  // below 2^-14: under half the smallest subnormal
  return sign | (t < static_cast<int16_t>((128 - B) << 7) ? sub : normal);
}

inline u16x32 encode_bf16_scaled_fp8_e4m3fn(u16x32 u, int16_t s_shift) {
  return bf16_scaled_minifloat<3, 7, 0x43e0, 0x4000, 8, 0x80>(u, s_shift);  // max 448, magic 2
}
inline u16x32 encode_bf16_scaled_fp4_e2m1(u16x32 u, int16_t s_shift) {
  return bf16_scaled_minifloat<1, 1, 0x40c0, 0x6000, 12, 0x8>(u, s_shift);  // max 6, magic 512
}

// Low bytes of 32 u16 lanes as 32 consecutive bytes.
inline void store_bytes32(uint8_t* p, u16x32 codes) {
  u8x64 b;
  std::memcpy(&b, &codes, sizeof b);
  typedef uint8_t u8x32 __attribute__((vector_size(32)));
  const u8x32 r = __builtin_shufflevector(b, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36,
                                          38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62);
  std::memcpy(p, &r, sizeof r);
}

// 32 nibbles in u16 lanes packed into 16 bytes, nibble 2i low in byte i.
inline void store_nibble_pairs32(uint8_t* p, u16x32 nibbles) {
  u32x16 w;
  std::memcpy(&w, &nibbles, sizeof w);
  store_bytes(p, (w & 0xfu) | ((w >> 12) & 0xf0u));
}

}  // namespace genbridge::vec
