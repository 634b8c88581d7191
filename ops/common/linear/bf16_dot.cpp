// The bf16 pair contract on AVX512_BF16 (contract: ops/common/linear/bf16_dot.h), x86-64 only. Compiled for that
// instruction set function by function (target attributes); called only where the CPU has it (bf16_dot_enabled).
#include "ops/common/linear/bf16_dot.h"

#include "ops/common/linear/dot_kernel.h"

#if defined(__x86_64__) && defined(__GNUC__)

#include <immintrin.h>

#include <cstring>
#include <utility>

#define GB_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma,avx2")))

namespace genbridge::ops::detail {
namespace {

// The contract's lane sum: s8[i] = v[i] + v[i + 8], s4[i] = s8[i] + s8[i + 4], (s4[0] + s4[2]) + (s4[1] + s4[3]).
GB_BF16_TARGET inline float ReduceLanes(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));  // s4[0] + s4[2], s4[1] + s4[3]
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

template <int MR, int NR, bool kStream>
GB_BF16_TARGET __attribute__((noinline)) void GemvTile(const uint32_t* xw, int64_t ldx, const bf16_t* w, int64_t ldw,
                                                       int64_t K, float* out, int64_t ldo) {
  __m512 acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_setzero_ps();
  const char* wb = reinterpret_cast<const char*>(w);
  const int64_t row_bytes = ldw * 2;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512i wv[NR];
    for (int c = 0; c < NR; ++c) {
      // Weights from memory: the next tile's rows at the same offset (the hardware prefetchers stop at 4 KiB
      // pages). Weights already in cache: none (a prefetch there costs 10% at 7 rows; measured, Zen 5).
      if constexpr (kStream) __builtin_prefetch(wb + (c + NR) * row_bytes + k * 2, 0, 1);
      wv[c] = _mm512_loadu_si512(wb + c * row_bytes + k * 2);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i xv = _mm512_loadu_si512(xw + r * ldx + k / 2);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xv, (__m512bh)wv[c]);
    }
  }
  if (k < K) {
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
    __m512i wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = _mm512_maskz_loadu_epi16(mask, wb + c * row_bytes + k * 2);
    for (int r = 0; r < MR; ++r) {
      const __m512i xv = _mm512_loadu_si512(xw + r * ldx + k / 2);
      for (int c = 0; c < NR; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], (__m512bh)xv, (__m512bh)wv[c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NR; ++c) out[r * ldo + c] = ReduceLanes(acc[r][c]);
}

// Weight rows per tile: MR x NR accumulators, NR weight vectors and one input vector in 32 registers.
constexpr int GemvCols(int mr) {
  const int nr = 31 / (mr + 1);
  return nr > 4 ? 4 : nr;
}

template <int MR>
void GemvRows(const uint32_t* xw, int64_t ldx, const bf16_t* w, int64_t ldw, int64_t n, int64_t K, float* out,
              int64_t ldo, bool stream) {
  for_column_tiles<GemvCols(MR)>(n, [&]<int NR>(int64_t c) {
    if (stream) {
      GemvTile<MR, NR, true>(xw, ldx, w + c * ldw, ldw, K, out + c, ldo);
    } else {
      GemvTile<MR, NR, false>(xw, ldx, w + c * ldw, ldw, K, out + c, ldo);
    }
  });
}

template <int... MRs>
void GemvFor(int64_t m, const uint32_t* xw, int64_t ldx, const bf16_t* w, int64_t ldw, int64_t n, int64_t K,
             float* out, int64_t ldo, bool stream, std::integer_sequence<int, MRs...>) {
  ((m == MRs + 1 ? GemvRows<MRs + 1>(xw, ldx, w, ldw, n, K, out, ldo, stream) : void()), ...);
}

template <int MR, int LL>
GB_BF16_TARGET __attribute__((noinline)) void PackedMicro(const uint32_t* ap, const uint32_t* bp, int64_t JP, int l0,
                                                          float* part) {
  __m512 acc[LL][MR];
  for (int i = 0; i < LL; ++i)
    for (int r = 0; r < MR; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t jp = 0; jp < JP; ++jp) {
    for (int i = 0; i < LL; ++i) {
      const int64_t l = l0 + i;
      // The next lane group's line at the same step (as the fp32 micro-kernel does).
      __builtin_prefetch(bp + ((l + LL) * JP + jp) * 16, 0, 1);
      const __m512i wv = _mm512_loadu_si512(bp + (l * JP + jp) * 16);
      const uint32_t* a = ap + (l * JP + jp) * MR;
      for (int r = 0; r < MR; ++r) {
        const __m512i xv = _mm512_set1_epi32(static_cast<int>(a[r]));
        acc[i][r] = _mm512_dpbf16_ps(acc[i][r], (__m512bh)xv, (__m512bh)wv);
      }
    }
  }
  for (int i = 0; i < LL; ++i)
    for (int r = 0; r < MR; ++r) _mm512_storeu_ps(part + ((l0 + i) * MR + r) * 16, acc[i][r]);
}

// Two panels of one lane: each broadcast input word feeds both panels' weight vectors (loads per dot: 14 / 24
// at 12 rows, against 13 / 12 for one panel).
template <int MR>
GB_BF16_TARGET __attribute__((noinline)) void PackedMicro2(const uint32_t* ap, const uint32_t* bp0, const uint32_t* bp1,
                                                           int64_t JP, int l, float* part0, float* part1) {
  __m512 acc0[MR], acc1[MR];
  for (int r = 0; r < MR; ++r) acc0[r] = acc1[r] = _mm512_setzero_ps();
  const uint32_t* w0 = bp0 + l * JP * 16;
  const uint32_t* w1 = bp1 + l * JP * 16;
  const uint32_t* a = ap + l * JP * MR;
  for (int64_t jp = 0; jp < JP; ++jp) {
    // The next lane's lines at the same step (as PackedMicro).
    __builtin_prefetch(w0 + (JP + jp) * 16, 0, 1);
    __builtin_prefetch(w1 + (JP + jp) * 16, 0, 1);
    const __m512i wv0 = _mm512_loadu_si512(w0 + jp * 16), wv1 = _mm512_loadu_si512(w1 + jp * 16);
    for (int r = 0; r < MR; ++r) {
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(a[jp * MR + r]));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], (__m512bh)xv, (__m512bh)wv0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], (__m512bh)xv, (__m512bh)wv1);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(part0 + (l * MR + r) * 16, acc0[r]);
    _mm512_storeu_ps(part1 + (l * MR + r) * 16, acc1[r]);
  }
}

template <int... MRs>
void Packed2ForRows(int mr, const uint32_t* ap, const uint32_t* bp0, const uint32_t* bp1, int64_t JP, int l,
                    float* part0, float* part1, std::integer_sequence<int, MRs...>) {
  ((mr == MRs + 1 ? PackedMicro2<MRs + 1>(ap, bp0, bp1, JP, l, part0, part1) : void()), ...);
}

template <int MR>
void PackedFor(int ll, const uint32_t* ap, const uint32_t* bp, int64_t JP, int l0, float* part) {
  switch (ll) {
    case 1:
      return PackedMicro<MR, 1>(ap, bp, JP, l0, part);
    case 2:
      if constexpr (2 * MR <= 24) return PackedMicro<MR, 2>(ap, bp, JP, l0, part);
      break;
    case 4:
      if constexpr (4 * MR <= 24) return PackedMicro<MR, 4>(ap, bp, JP, l0, part);
      break;
    case 8:
      if constexpr (8 * MR <= 24) return PackedMicro<MR, 8>(ap, bp, JP, l0, part);
      break;
  }
  __builtin_trap();  // outside the documented shapes
}

template <int... MRs>
void PackedForRows(int mr, int ll, const uint32_t* ap, const uint32_t* bp, int64_t JP, int l0, float* part,
                   std::integer_sequence<int, MRs...>) {
  ((mr == MRs + 1 ? PackedFor<MRs + 1>(ll, ap, bp, JP, l0, part) : void()), ...);
}

}  // namespace

void bf16_dot_packed_micro2(int mr, const uint32_t* ap, const uint32_t* bp0, const uint32_t* bp1, int64_t JP, int l,
                            float* part0, float* part1) {
  Packed2ForRows(mr, ap, bp0, bp1, JP, l, part0, part1, std::make_integer_sequence<int, 12>());
}

void bf16_dot_gemv(const uint32_t* xw, int64_t ldx, int64_t m, const bf16_t* w, int64_t ldw, int64_t n, int64_t K,
                   float* out, int64_t ldo, bool stream) {
  GemvFor(m, xw, ldx, w, ldw, n, K, out, ldo, stream, std::make_integer_sequence<int, 7>());
}

void bf16_dot_packed_micro(int mr, int ll, const uint32_t* ap, const uint32_t* bp, int64_t JP, int l0, float* part) {
  PackedForRows(mr, ll, ap, bp, JP, l0, part, std::make_integer_sequence<int, 12>());
}

}  // namespace genbridge::ops::detail

#else  // no AVX512_BF16 code on this architecture: never called (simd::bf16_dot_enabled() is false)

namespace genbridge::ops::detail {
void bf16_dot_gemv(const uint32_t*, int64_t, int64_t, const bf16_t*, int64_t, int64_t, int64_t, float*, int64_t, bool) {
  __builtin_trap();
}
void bf16_dot_packed_micro(int, int, const uint32_t*, const uint32_t*, int64_t, int, float*) { __builtin_trap(); }
void bf16_dot_packed_micro2(int, const uint32_t*, const uint32_t*, const uint32_t*, int64_t, int, float*, float*) {
  __builtin_trap();
}
}  // namespace genbridge::ops::detail

#endif
