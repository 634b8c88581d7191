#pragma once
// Internal: fixed-width (16 x fp32) portable vectors built on GCC/Clang vector extensions. The lane
// count is fixed so that reduction order, and hence every rounding, is the same on every ISA. Where
// AVX-512 is available the format conversions use it directly; results are identical either way.

#include <cstdint>
#include <cstring>

#include "genbridge/core/formats.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define GB_VEC_AVX512 1
#endif

namespace genbridge::vec {

inline constexpr int kLanes = 16;
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
#if defined(__aarch64__)
// GCC 12 has no C++ _Float16 on aarch64; __fp16 (IEEE binary16 there) converts the same way.
typedef __fp16 h16x16 __attribute__((vector_size(32)));
#else
typedef _Float16 h16x16 __attribute__((vector_size(32)));
#endif

inline f32x16 splat(float v) { return f32x16{} + v; }

inline f32x16 load(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, f32x16 v) { std::memcpy(p, &v, sizeof v); }

#ifdef GB_VEC_AVX512

inline f32x16 from_m512(__m512 v) {
  f32x16 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}
inline __m512 to_m512(f32x16 v) {
  __m512 r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

inline f32x16 load(const bf16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return from_m512(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
}
inline f32x16 load(const fp16_t* p) {
  return from_m512(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}
// RNE to bf16; NaN -> quiet NaN. The hardware convert (where present) treats subnormal inputs as zero, so
// vectors holding a subnormal or NaN take the integer path; both give the scalar codec's bits.
inline void store(bf16_t* p, f32x16 v) {
  const __m512 f = to_m512(v);
#ifdef __AVX512BF16__
  if (_mm512_fpclass_ps_mask(f, 0x01 | 0x20 | 0x80) == 0) {  // no QNaN, subnormal or SNaN lane
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(f)));
    return;
  }
#endif
  const __m512i u = _mm512_castps_si512(f);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline void store(fp16_t* p, f32x16 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(to_m512(v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

#else

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
  return __builtin_convertvector(h, f32x16);  // exact widening
}
inline void store(bf16_t* p, f32x16 v) {
  u32x16 u;
  std::memcpy(&u, &v, sizeof u);
  const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const u32x16 quiet_nan = (u >> 16) | 0x40u;
  const u32x16 is_nan = (u32x16)((u & 0x7fffffffu) > 0x7f800000u);  // all-ones lanes where NaN
  const u32x16 r = (quiet_nan & is_nan) | (rounded & ~is_nan);
  const u16x16 h = __builtin_convertvector(r, u16x16);
  std::memcpy(p, &h, sizeof h);
}
inline void store(fp16_t* p, f32x16 v) {
  const h16x16 h = __builtin_convertvector(v, h16x16);  // RNE narrowing
  std::memcpy(p, &h, sizeof h);
}

#endif

// Sum of the 16 lanes in a fixed pairwise order.
inline float reduce_add(f32x16 v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

}  // namespace genbridge::vec
