#pragma once
// Internal: vector math for the attention kernels on the fixed 16-lane vectors of core/vec.h. Every
// function is a fixed sequence of IEEE operations (no FMA: -ffp-contract=off), so results are the same
// on every ISA and thread count.

#include <cstdint>
#include <cstring>

#include "genbridge/core/formats.h"

#include "core/vec.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace genbridge::ops::detail {

using vec::f32x16;
using vec::i32x16;
using vec::u32x16;

inline f32x16 bits_to_f32(u32x16 u) {
  f32x16 v;
  std::memcpy(&v, &u, sizeof v);
  return v;
}
inline u32x16 f32_to_bits(f32x16 v) {
  u32x16 u;
  std::memcpy(&u, &v, sizeof u);
  return u;
}
inline f32x16 select(i32x16 mask, f32x16 a, f32x16 b) {  // mask lanes all-ones -> a, else b
  const u32x16 m = (u32x16)mask;
  return bits_to_f32((f32_to_bits(a) & m) | (f32_to_bits(b) & ~m));
}
inline f32x16 vmax(f32x16 a, f32x16 b) { return select(a > b, a, b); }

inline float reduce_max(f32x16 v) {
  float m = v[0];
  for (int i = 1; i < vec::kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x) for x <= 0 (softmax weights after subtracting the running maximum). Cody-Waite range
// reduction x = n*ln2 + r, |r| <= ln2/2, then the degree-7 Taylor-like minimax polynomial of Cephes'
// expf; about 2 ulp. Exact at the two points the online softmax relies on: exp(0) = 1 and
// exp(-inf) = 0 (also for every x < -87, which flushes to 0 instead of producing subnormals).
inline f32x16 exp_nonpositive(f32x16 x) {
  const i32x16 underflow = x < -87.0f;
  const f32x16 xc = select(underflow, vec::splat(0.0f), x);
  // n = round-to-nearest-even(x / ln2) via the 1.5 * 2^23 shifter; |x / ln2| < 126 here.
  const f32x16 shifted = xc * 1.44269504088896341f + 12582912.0f;
  const f32x16 n = shifted - 12582912.0f;
  const f32x16 r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  f32x16 p = vec::splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * (r * r) + r) + 1.0f;
  // 2^n from the integer n held in the low bits of `shifted` (n in [-126, 0]).
  const i32x16 ni = (i32x16)shifted - 0x4b400000;  // bit reinterpretation, not conversion
  const u32x16 pow2 = (u32x16)ni + 127u;
  const f32x16 e = p * bits_to_f32(pow2 << 23);
  return select(underflow, vec::splat(0.0f), e);
}

// out[j] = sum of the 16 lanes of v[j], for 16 vectors at once: a fixed four-level pairwise tree
// (lanes i and i+8, then i and i+4, ...), 15 adds and 30 shuffles instead of 16 separate reductions.
inline f32x16 transpose_reduce16(const f32x16* v) {
  f32x16 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i) {
    const f32x16 a = v[2 * i], b = v[2 * i + 1];
    w[i] = __builtin_shuffle(a, b, i32x16{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
           __builtin_shuffle(a, b, i32x16{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
  }
  for (int i = 0; i < 4; ++i) {
    const f32x16 a = w[2 * i], b = w[2 * i + 1];
    x[i] = __builtin_shuffle(a, b, i32x16{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}) +
           __builtin_shuffle(a, b, i32x16{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31});
  }
  for (int i = 0; i < 2; ++i) {
    const f32x16 a = x[2 * i], b = x[2 * i + 1];
    y[i] = __builtin_shuffle(a, b, i32x16{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}) +
           __builtin_shuffle(a, b, i32x16{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31});
  }
  return __builtin_shuffle(y[0], y[1], i32x16{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}) +
         __builtin_shuffle(y[0], y[1], i32x16{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
}

// ---- KV element decoders: 16 elements to fp32 ----
// Conversions are exact, so the intrinsic paths (GCC 12 scalarizes __builtin_convertvector from 8- and
// 16-bit lanes to fp32) give the same values as the portable fallbacks on every ISA.

// GCC 12 warns about the deliberately undefined pass-through operand inside the AVX-512 intrinsics.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// int8 codes -> fp32 (exact).
inline f32x16 load_i8(const void* p) {
#if defined(__AVX512F__)
  return (f32x16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))));
#else
  int8_t b[16];
  std::memcpy(b, p, sizeof b);
  f32x16 v;
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(b[i]);
  return v;
#endif
}

// fp8 e4m3fn codes -> fp32 value * 2^-8, exactly: moving sign, exponent and mantissa into an fp16
// (bias 15 instead of 7) divides by 2^8 and maps subnormals to subnormals. The NaN code S.1111.111
// becomes an fp16 NaN. Callers fold the 2^8 into the row scale.
inline f32x16 load_fp8_e4m3fn_scaled(const void* p) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  const __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  const __m256i mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7f));
  const __m256i nan = _mm256_and_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7e00));
  const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8);
  const __m256i bits = _mm256_or_si256(_mm256_or_si256(sign, _mm256_slli_epi16(mag, 7)), nan);
  return (f32x16)_mm512_cvtph_ps(bits);
#else
  uint8_t b[16];
  std::memcpy(b, p, sizeof b);
  f32x16 v;
  for (int i = 0; i < 16; ++i) {
    const uint16_t mag = b[i] & 0x7f;
    const uint16_t bits = static_cast<uint16_t>(((b[i] & 0x80) << 8) | (mag << 7) | (mag == 0x7f ? 0x7e00 : 0));
    v[i] = fp16_to_float(fp16_t{bits});
  }
  return v;
#endif
}

#pragma GCC diagnostic pop

}  // namespace genbridge::ops::detail
