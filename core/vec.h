#pragma once
// Internal: fixed-width (16 x fp32) portable vectors built on GCC/Clang vector extensions. The lane
// count is fixed so that reduction order, and hence every rounding, is the same on every ISA.

#include <cstdint>
#include <cstring>

#include "genbridge/core/formats.h"

namespace genbridge::vec {

inline constexpr int kLanes = 16;
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef _Float16 h16x16 __attribute__((vector_size(32)));

inline f32x16 splat(float v) { return f32x16{} + v; }

inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline f32x16 load(const bf16_t* p) {
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  const u32x16 w = __builtin_convertvector(h, u32x16) << 16;
  f32x16 v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}
inline f32x16 load(const fp16_t* p) {
  h16x16 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, f32x16);  // exact widening (vcvtph2ps where available)
}

inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }
inline void store(bf16_t* p, f32x16 v) {
  u32x16 u;
  std::memcpy(&u, &v, sizeof u);
  const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const u32x16 quiet_nan = (u >> 16) | 0x40u;
  const u32x16 is_nan = (u & 0x7fffffffu) > 0x7f800000u;  // all-ones lanes where NaN
  const u32x16 r = (quiet_nan & is_nan) | (rounded & ~is_nan);
  const u16x16 h = __builtin_convertvector(r, u16x16);
  std::memcpy(p, &h, sizeof h);
}
inline void store(fp16_t* p, f32x16 v) {
  const h16x16 h = __builtin_convertvector(v, h16x16);  // RNE narrowing (vcvtps2ph where available)
  std::memcpy(p, &h, sizeof h);
}

// Sum of the 16 lanes in a fixed pairwise order.
inline float reduce_add(f32x16 v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

}  // namespace genbridge::vec
