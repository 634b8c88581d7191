// attention/paged_decode's kernel (the contract in paged_attention.h), compiled once per CPU target with
// Highway (hwy/foreach_target.h re-includes this file per target; core/simd/dispatch.h picks the target
// once per op call). Every target computes the same sequence of IEEE operations per output element, so
// results are the same bits on every CPU target, thread count and batch.
#ifndef GENBRIDGE_OPS_ATTENTION_PAGED_ATTENTION_SHARED_
#define GENBRIDGE_OPS_ATTENTION_PAGED_ATTENTION_SHARED_

#include "ops/common/attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "ops/common/kv_cache/kv_layout.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail::paged {

constexpr int kMaxRows = 16;  // query rows (query token x query head of one kv head) per work item
constexpr int kChunk = 64;    // keys per online-softmax step; chunk boundaries are multiples of 64
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The int8 and fp8 representations' dequant + dot use fused multiply-adds (exact
// std::fma on targets without FMA instructions, so still the same bits everywhere); bf16 keeps the
// separate multiply and add of the contract.
constexpr bool kFusedQuantDot = true;

// One unit of work: rows [row_begin, row_begin + row_count) of sequence `seq` for kv head `kv_head`,
// where row = query token index * group + head in group.
struct Item {
  int32_t seq;
  int32_t kv_head;
  int32_t row_begin;
  int32_t row_count;
  int64_t num_keys;  // keys the item reads (the last row's position + 1); used to order work only
};

struct Plan {
  const PagedDecodeCall* call;
  KvGeometry g;
  int64_t group;  // query heads per kv head
  const uint8_t* key_base;
  const uint8_t* value_base;
  const fp16_t* key_scales;
  const fp16_t* value_scales;
};

// Scratch floats per item for head_dim d: q and acc rows, chunk weights, and the 16 x 16 partial dot
// products of each row for one block of 16 keys.
inline size_t scratch_floats(int64_t d) {
  return static_cast<size_t>(2 * kMaxRows * d + kMaxRows * kChunk + kMaxRows * 256);
}

}  // namespace genbridge::ops::detail::paged

#endif  // GENBRIDGE_OPS_ATTENTION_PAGED_ATTENTION_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/attention/paged_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/attention/vec_math-inl.h"
#include "ops/common/tensor/kernels-inl.h"

GB_OPS_KERNELS_BEGIN();
namespace {

using paged::Item;
using paged::kChunk;
using paged::kMaxRows;
using paged::kNegInf;
using paged::Plan;

// Accumulator budget in hardware vectors, as (rows x keys) for the scores and (rows x 2-vector column
// units) for the values: 16 on AVX-512's 32 registers, 8 on the 16 of AVX2/SSE4.
constexpr int kScoreTile = kParts == 1 ? 16 : kParts == 2 ? 4 : kParts == 4 ? 2 : 1;
constexpr int kValueTile = kParts == 1 ? 8 : kParts == 2 ? 4 : kParts == 4 ? 1 : 1;

// c + a * b: one rounding when fused (exact on every target), else the product rounded, then the sum.
template <bool kFused>
HWY_INLINE VF Step(VF a, VF b, VF c) {
  if constexpr (!kFused) {
    return hn::Add(c, hn::Mul(a, b));
  } else if constexpr (kNativeFma) {
    return hn::MulAdd(a, b, c);
  } else {
    alignas(64) float ta[kPart], tb[kPart], tc[kPart];
    hn::Store(a, DF(), ta);
    hn::Store(b, DF(), tb);
    hn::Store(c, DF(), tc);
    for (int l = 0; l < kPart; ++l) tc[l] = std::fma(ta[l], tb[l], tc[l]);
    return hn::Load(DF(), tc);
  }
}

// ---- per-format rows ----
// The kernel's column order: bf16 rows are split, per 64-byte line (32 columns), into their even and odd
// elements (one shift and one mask instead of a widening), so q and the output accumulators use the same
// "pair-interleaved" order: position 32p + i holds column 32p + 2i, position 32p + 16 + i column
// 32p + 2i + 1. The other formats keep the natural order. Contract lane l of a row's 16-lane partial dot
// product takes the positions = l (mod 16) in increasing order, whatever the hardware width.
//
// A row is read in "units" of two hardware vectors (lo, hi: 2 * kPart columns) and, for head dims with
// a 16-column remainder that no whole unit covers, in "singles" of one hardware vector (natural order).
template <int D, KvCacheFormat F>
struct Kv {
  static_assert(D % 32 == 0 || D % 32 == 16, "head_dim must be a multiple of 16");
  static constexpr bool kBf16 = F == KvCacheFormat::kBf16;
  static constexpr bool kScaled = !kBf16;
  static constexpr bool kFused = kScaled && paged::kFusedQuantDot;
  static constexpr int kPairs = D / 32;
  // Bytes of one (token, kv head) row in the K/V cache (fp8: the packed fp32 scale included).
  static constexpr int kRowBytes = static_cast<int>(gqa_kv_row_bytes(F, D).main);
  static constexpr int kUnits = kBf16 ? kPairs * kParts : D / (2 * kPart);
  static constexpr int kSingleBase = kBf16 ? 32 * kPairs : kUnits * 2 * kPart;
  static constexpr int kSingles = (D - kSingleBase) / kPart;
  // Units per group: the partial-vector parts a unit feeds depend only on its index in the group.
  static constexpr int kG = kBf16 ? kParts : (2 * kPart >= 16 ? 1 : 16 / (2 * kPart));
  static constexpr int kGroups = kUnits / kG;
  static_assert(kUnits % kG == 0, "whole groups");

  static constexpr int OffLo(int u) { return kBf16 ? 32 * (u / kParts) + kPart * (u % kParts) : 2 * kPart * u; }
  static constexpr int OffHi(int u) { return kBf16 ? OffLo(u) + 16 : 2 * kPart * u + kPart; }
  static constexpr int LoPart(int i) { return (OffLo(i) % 16) / kPart; }  // i = index in the group
  static constexpr int HiPart(int i) { return (OffHi(i) % 16) / kPart; }
  static constexpr int OffSingle(int s) { return kSingleBase + kPart * s; }
  static constexpr int SinglePart(int s) { return (OffSingle(s) % 16) / kPart; }

  // Columns of unit u of a row as fp32 (fp8: times 2^-8, compensated in scale()).
  static HWY_INLINE void LoadUnit(const uint8_t* row, int u, VF& lo, VF& hi) {
    if constexpr (kBf16) {
      const VU w =
          hn::LoadU(DU(), reinterpret_cast<const uint32_t*>(row + 64 * (u / kParts) + 4 * kPart * (u % kParts)));
      lo = hn::BitCast(DF(), hn::ShiftLeft<16>(w));
      hi = hn::BitCast(DF(), hn::And(w, hn::Set(DU(), 0xffff0000u)));
    } else if constexpr (F == KvCacheFormat::kInt8Fp16Scale) {
      lo = LoadI8Part(row + OffLo(u));
      hi = LoadI8Part(row + OffHi(u));
    } else {
      lo = LoadFp8ScaledPart(row + OffLo(u));
      hi = LoadFp8ScaledPart(row + OffHi(u));
    }
  }
  static HWY_INLINE VF LoadSingle(const uint8_t* row, int s) {
    if constexpr (kBf16) {
      const hn::Rebind<hwy::bfloat16_t, DF> db;
      return hn::PromoteTo(DF(), hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(row + 2 * OffSingle(s))));
    } else if constexpr (F == KvCacheFormat::kInt8Fp16Scale) {
      return LoadI8Part(row + OffSingle(s));
    } else {
      return LoadFp8ScaledPart(row + OffSingle(s));
    }
  }
  // Reorders a row of D natural-order columns into the kernel's column order (and back).
  static void ToKernelOrder(float* x) {
    if constexpr (kBf16) {
      float t[32];
      for (int p = 0; p < kPairs; ++p) {
        for (int i = 0; i < 16; ++i) t[i] = x[32 * p + 2 * i], t[16 + i] = x[32 * p + 2 * i + 1];
        std::memcpy(x + 32 * p, t, sizeof t);
      }
    }
  }
  static void ToNaturalOrder(float* x) {
    if constexpr (kBf16) {
      float t[32];
      for (int p = 0; p < kPairs; ++p) {
        for (int i = 0; i < 16; ++i) t[2 * i] = x[32 * p + i], t[2 * i + 1] = x[32 * p + 16 + i];
        std::memcpy(x + 32 * p, t, sizeof t);
      }
    }
  }
  static float Scale(const uint8_t* row, const fp16_t* scales, int64_t r) {
    if constexpr (F == KvCacheFormat::kInt8Fp16Scale) {
      return fp16_to_float(scales[r]);
    } else if constexpr (F == KvCacheFormat::kFp8Fp32PackedScale) {
      float sc;
      std::memcpy(&sc, row + D, sizeof sc);
      return sc * 256.0f;  // exact: undoes the 2^-8 of LoadFp8ScaledPart
    } else {
      (void)row, (void)scales, (void)r;
      return 1.0f;
    }
  }
};

// Calls fn.template operator()<NR>(r0) over [0, rows) in register blocks of 4, 2 and 1 rows.
template <typename Fn>
HWY_INLINE void ForRowBlocks(int rows, Fn&& fn) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) fn.template operator()<4>(r);
  if (r + 2 <= rows) fn.template operator()<2>(r), r += 2;
  if (r < rows) fn.template operator()<1>(r);
}

// part[r][kk0 + b][0..16) = the 16-lane partial dot products of q rows r0..r0+NR with keys krows[0..KB).
template <int D, KvCacheFormat F, int NR, int KB>
HWY_NOINLINE void ScoreTile(const float* HWY_RESTRICT q, const uint8_t* const* krows, float* HWY_RESTRICT part, int r0,
                            int kk0) {
  using K = Kv<D, F>;
  const DF df;
  VF acc[NR][KB][kParts];
  GB_UNROLL for (int r = 0; r < NR; ++r) {
    GB_UNROLL for (int b = 0; b < KB; ++b) { GB_UNROLL for (int j = 0; j < kParts; ++j) acc[r][b][j] = hn::Zero(df); }
  }
  // The group loop stays rolled: unrolled, the compiler hoists the loads of later groups and spills.
#pragma GCC unroll 1
  for (int g = 0; g < K::kGroups; ++g) {
    GB_UNROLL for (int i = 0; i < K::kG; ++i) {
      const int u = g * K::kG + i;
      GB_UNROLL for (int b = 0; b < KB; ++b) {
        VF lo, hi;
        K::LoadUnit(krows[b], u, lo, hi);
        GB_UNROLL for (int r = 0; r < NR; ++r) {
          const float* qr = q + (r0 + r) * D;
          acc[r][b][K::LoPart(i)] = Step<K::kFused>(hn::LoadU(df, qr + K::OffLo(u)), lo, acc[r][b][K::LoPart(i)]);
          acc[r][b][K::HiPart(i)] = Step<K::kFused>(hn::LoadU(df, qr + K::OffHi(u)), hi, acc[r][b][K::HiPart(i)]);
        }
      }
    }
  }
  GB_UNROLL for (int s = 0; s < K::kSingles; ++s) {
    GB_UNROLL for (int b = 0; b < KB; ++b) {
      const VF v = K::LoadSingle(krows[b], s);
      GB_UNROLL for (int r = 0; r < NR; ++r) {
        const float* qr = q + (r0 + r) * D;
        acc[r][b][K::SinglePart(s)] =
            Step<K::kFused>(hn::LoadU(df, qr + K::OffSingle(s)), v, acc[r][b][K::SinglePart(s)]);
      }
    }
  }
  GB_UNROLL for (int r = 0; r < NR; ++r) {
    GB_UNROLL for (int b = 0; b < KB; ++b) {
      float* dst = part + ((r0 + r) * 16 + kk0 + b) * 16;
      GB_UNROLL for (int j = 0; j < kParts; ++j) hn::StoreU(acc[r][b][j], df, dst + j * kPart);
    }
  }
}

// acc[r0 + r][units u0..u0+CU) += sum over keys k (in order) of w[r0 + r][k] * v_k.
template <int D, KvCacheFormat F, int NR, int CU>
HWY_NOINLINE void ValueTile(float* HWY_RESTRICT acc, const float* HWY_RESTRICT w, const uint8_t* const* vrows, int cn,
                            int r0, int u0) {
  using K = Kv<D, F>;
  const DF df;
  VF a[NR][CU][2];
  GB_UNROLL for (int r = 0; r < NR; ++r) {
    GB_UNROLL for (int c = 0; c < CU; ++c) {
      a[r][c][0] = hn::LoadU(df, acc + (r0 + r) * D + K::OffLo(u0 + c));
      a[r][c][1] = hn::LoadU(df, acc + (r0 + r) * D + K::OffHi(u0 + c));
    }
  }
  for (int k = 0; k < cn; ++k) {
    const uint8_t* row = vrows[k];
    GB_UNROLL for (int c = 0; c < CU; ++c) {  // one unit's two vectors live at a time
      VF lo, hi;
      K::LoadUnit(row, u0 + c, lo, hi);
      GB_UNROLL for (int r = 0; r < NR; ++r) {
        const VF wk = hn::Set(df, w[(r0 + r) * kChunk + k]);
        a[r][c][0] = Step<K::kFused>(wk, lo, a[r][c][0]);
        a[r][c][1] = Step<K::kFused>(wk, hi, a[r][c][1]);
      }
    }
  }
  GB_UNROLL for (int r = 0; r < NR; ++r) {
    GB_UNROLL for (int c = 0; c < CU; ++c) {
      hn::StoreU(a[r][c][0], df, acc + (r0 + r) * D + K::OffLo(u0 + c));
      hn::StoreU(a[r][c][1], df, acc + (r0 + r) * D + K::OffHi(u0 + c));
    }
  }
}

template <int D, KvCacheFormat F, int NR>
HWY_NOINLINE void ValueSingle(float* HWY_RESTRICT acc, const float* HWY_RESTRICT w, const uint8_t* const* vrows, int cn,
                              int r0, int s) {
  using K = Kv<D, F>;
  const DF df;
  VF a[NR];
  GB_UNROLL for (int r = 0; r < NR; ++r) a[r] = hn::LoadU(df, acc + (r0 + r) * D + K::OffSingle(s));
  for (int k = 0; k < cn; ++k) {
    const VF v = K::LoadSingle(vrows[k], s);
    GB_UNROLL for (int r = 0; r < NR; ++r) a[r] = Step<K::kFused>(hn::Set(df, w[(r0 + r) * kChunk + k]), v, a[r]);
  }
  GB_UNROLL for (int r = 0; r < NR; ++r) hn::StoreU(a[r], df, acc + (r0 + r) * D + K::OffSingle(s));
}

template <int D, KvCacheFormat F>
HWY_NOINLINE void Attend(const Plan& p, const Item& it, float* scratch) {
  using K = Kv<D, F>;
  const PagedDecodeCall& c = *p.call;
  const KvGeometry& g = p.g;
  const int nr = it.row_count;

  float* q = scratch;                   // [kMaxRows][D]
  float* acc = q + kMaxRows * D;        // [kMaxRows][D]
  float* w = acc + kMaxRows * D;        // [kMaxRows][kChunk]
  float* part = w + kMaxRows * kChunk;  // [kMaxRows][16 keys][16 lanes]
  float m[kMaxRows], l[kMaxRows];
  int64_t pos[kMaxRows], token[kMaxRows], head[kMaxRows];
  alignas(64) float kscale[kChunk], vscale[kChunk];
  // Row pointers of this chunk and the next (computed while this one runs, to prefetch its first keys).
  const uint8_t* krows[2][kChunk];
  const uint8_t* vrows[2][kChunk];
  int64_t slot_rows[2][kChunk];

  const int64_t q_begin = at_i32(c.query_start_loc, it.seq);
  const int64_t q_len = at_i32(c.query_start_loc, it.seq + 1) - q_begin;
  const int64_t ctx = at_i32(c.context_lens, it.seq);
  const int64_t num_q_heads = c.query.dim(1);
  int64_t num_keys = 0;
  for (int r = 0; r < nr; ++r) {
    const int64_t row = it.row_begin + r;
    const int64_t t = row / p.group;
    token[r] = q_begin + t;
    head[r] = it.kv_head * p.group + row % p.group;
    pos[r] = ctx - q_len + t;
    num_keys = std::max(num_keys, pos[r] + 1);
    float* qr = q + r * D;
    load_row_f32(c.query, 1, token[r] * num_q_heads + head[r], D, qr);
    for (int i = 0; i < D; ++i) qr[i] *= c.softmax_scale;
    K::ToKernelOrder(qr);
    m[r] = kNegInf;
    l[r] = 0.f;
    std::fill(acc + r * D, acc + (r + 1) * D, 0.f);
  }

  // Row pointers of the keys [j0, j0 + kChunk) ∩ [0, num_keys) into buffer b.
  auto fill_rows = [&](int64_t j0, int b) {
    const int cn = static_cast<int>(std::min<int64_t>(kChunk, num_keys - j0));
    int64_t page = j0 / g.block_size, offset = j0 % g.block_size;
    int64_t base = g.row(at_i32(c.block_tables, it.seq, page), it.kv_head, 0);
    for (int k = 0; k < cn; ++k) {
      if (offset == g.block_size) {
        offset = 0;
        base = g.row(at_i32(c.block_tables, it.seq, ++page), it.kv_head, 0);
      }
      const int64_t r = base + offset++;
      slot_rows[b][k] = r;
      krows[b][k] = p.key_base + r * K::kRowBytes;
      vrows[b][k] = p.value_base + r * K::kRowBytes;
    }
  };
  auto prefetch_rows = [&](const uint8_t* const* rows, int n) {
    for (int k = 0; k < n; ++k) {
      GB_UNROLL for (int b = 0; b < K::kRowBytes; b += 64) __builtin_prefetch(rows[k] + b);
      if constexpr (K::kRowBytes % 64 != 0) __builtin_prefetch(rows[k] + K::kRowBytes - 1);
    }
  };
  fill_rows(0, 0);
  for (int64_t j0 = 0, cur = 0; j0 < num_keys; j0 += kChunk, cur ^= 1) {
    const int cn = static_cast<int>(std::min<int64_t>(kChunk, num_keys - j0));
    const uint8_t* const* krow = krows[cur];
    const uint8_t* const* vrow = vrows[cur];
    const bool more = j0 + kChunk < num_keys;
    if (more) fill_rows(j0 + kChunk, cur ^ 1);
    for (int k = cn; k < kChunk; ++k) kscale[k] = vscale[k] = 0.f;

    // Scores, 16 keys at a time: per (row, key) a 16-lane partial dot product, then the 16 keys' sums at
    // once. Meanwhile the next 16 K rows (the next chunk's first ones at the end) and these keys' V rows
    // are prefetched. Row scales are read once the rows are in cache (fp8 keeps them in the row).
    for (int k0 = 0; k0 < cn; k0 += 16) {
      const int kn = std::min(16, cn - k0);
      if (k0 + 16 < cn) {
        prefetch_rows(krow + k0 + 16, std::min(16, cn - k0 - 16));
      } else if (more) {
        prefetch_rows(krows[cur ^ 1], static_cast<int>(std::min<int64_t>(16, num_keys - j0 - kChunk)));
      }
      prefetch_rows(vrow + k0, kn);
      ForRowBlocks(nr, [&]<int NR>(int r0) {
        constexpr int KB = kScoreTile / NR > 1 ? kScoreTile / NR : 1;
        int kk = 0;
        for (; kk + KB <= kn; kk += KB) ScoreTile<D, F, NR, KB>(q, krow + k0 + kk, part, r0, kk);
        for (; kk < kn; ++kk) ScoreTile<D, F, NR, 1>(q, krow + k0 + kk, part, r0, kk);
      });
      for (int k = k0; k < k0 + kn; ++k) kscale[k] = K::Scale(krow[k], p.key_scales, slot_rows[cur][k]);
      for (int r = 0; r < nr; ++r) {
        float* pr = part + r * 256;
        if (kn < 16) std::fill(pr + kn * 16, pr + 256, 0.f);
        float* wr = w + r * kChunk + k0;
        ReduceKeys16(pr, wr);
        if constexpr (K::kScaled) Store16(wr, Mul16(Load16(wr), Load16(kscale + k0)));
        const int64_t visible = std::max<int64_t>(std::min<int64_t>(kn, pos[r] - (j0 + k0) + 1), 0);  // keys <= pos[r]
        for (int64_t k = visible; k < 16; ++k) wr[k] = kNegInf;
      }
    }
    for (int k = 0; k < cn; ++k) vscale[k] = K::Scale(vrow[k], p.value_scales, slot_rows[cur][k]);

    // Online softmax: rescale the running sums when the maximum grows. Masked keys weigh exactly 0, and
    // a chunk entirely beyond a row's position leaves that row bit for bit unchanged (alpha = exp(0) = 1).
    const int cn16 = (cn + 15) & ~15;
    for (int r = 0; r < nr; ++r) {
      float* wr = w + r * kChunk;
      V16 mx = Set16(kNegInf);
      for (int k0 = 0; k0 < cn16; k0 += 16) mx = MaxGt16(mx, Load16(wr + k0));
      const float m_new = std::max(m[r], ReduceMaxSeq16(mx));
      const float alpha = Lane16(ExpNonpositive16(Set16(m[r] - m_new)), 0);
      V16 sum = Zero16();
      for (int k0 = 0; k0 < cn16; k0 += 16) {
        V16 e = ExpNonpositive16(Load16(wr + k0) - Set16(m_new));
        sum = sum + e;
        if constexpr (K::kScaled) e = e * Load16(vscale + k0);
        Store16(wr + k0, e);
      }
      l[r] = l[r] * alpha + ReduceAdd16(sum);
      m[r] = m_new;
      if (alpha != 1.0f) {
        float* ar = acc + r * D;
        for (int i = 0; i < D; i += kLanes) Store16(ar + i, Load16(ar + i) * Set16(alpha));
      }
    }

    // acc[r] += sum_k w[r][k] * v_k, keys in order, with a tile of rows x columns in registers.
    ForRowBlocks(nr, [&]<int NR>(int r0) {
      constexpr int CU = kValueTile / NR > 1 ? kValueTile / NR : 1;
      constexpr int kFull = K::kUnits / CU * CU;
      for (int u = 0; u < kFull; u += CU) ValueTile<D, F, NR, CU>(acc, w, vrow, cn, r0, u);
      for (int u = kFull; u < K::kUnits; ++u) ValueTile<D, F, NR, 1>(acc, w, vrow, cn, r0, u);
      for (int s = 0; s < K::kSingles; ++s) ValueSingle<D, F, NR>(acc, w, vrow, cn, r0, s);
    });
  }

  for (int r = 0; r < nr; ++r) {
    float* ar = acc + r * D;
    for (int i = 0; i < D; i += kLanes) Store16(ar + i, Load16(ar + i) / Set16(l[r]));
    K::ToNaturalOrder(ar);
    store_row_f32(c.out, 1, token[r] * num_q_heads + head[r], D, ar);
  }
}

template <int D>
void AttendDim(const Plan& p, const Item& it, float* scratch) {
  switch (p.call->cache.format) {
    case KvCacheFormat::kBf16:
      return Attend<D, KvCacheFormat::kBf16>(p, it, scratch);
    case KvCacheFormat::kInt8Fp16Scale:
      return Attend<D, KvCacheFormat::kInt8Fp16Scale>(p, it, scratch);
    case KvCacheFormat::kFp8Fp32PackedScale:
      return Attend<D, KvCacheFormat::kFp8Fp32PackedScale>(p, it, scratch);
  }
}

}  // namespace

// One work item (validated call; head_dim one of kPagedDecodeHeadDims).
void AttendItem(const Plan& p, const Item& it, float* scratch) {
  switch (p.g.head_dim) {
    case 64:
      return AttendDim<64>(p, it, scratch);
    case 80:
      return AttendDim<80>(p, it, scratch);
    case 96:
      return AttendDim<96>(p, it, scratch);
    case 112:
      return AttendDim<112>(p, it, scratch);
    case 128:
      return AttendDim<128>(p, it, scratch);
    case 192:
      return AttendDim<192>(p, it, scratch);
    case 256:
      return AttendDim<256>(p, it, scratch);
    default:
      return;
  }
}

GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(AttendItem);

namespace {

using paged::Item;
using paged::kMaxRows;
using paged::Plan;

std::string fmt_float(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(v));
  return text;
}

Status validate(const PagedDecodeCall& c, KvGeometry& g) {
  const char* op = c.op;
  GB_RETURN_IF_ERROR(check_float_input(op, "query", c.query));
  if (c.query.rank() != 3) {
    return invalid_argument(s(op) + ": query has shape " + c.query.shape_string() +
                            " but must have rank 3 [num_query_tokens, num_heads, head_dim]");
  }
  if (c.out.dtype() != DType::kF32 && c.out.dtype() != DType::kBF16) {
    return invalid_argument(s(op) + ": out has dtype " + s(dtype_name(c.out.dtype())) + " but must be fp32 or bf16");
  }
  bool same = c.out.rank() == 3;
  for (int d = 0; same && d < 3; ++d) same = c.out.dim(d) == c.query.dim(d);
  if (!same) {
    return invalid_argument(s(op) + ": out has shape " + c.out.shape_string() + " but must have query's shape " +
                            c.query.shape_string());
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "out", c.out));
  GB_ASSIGN_OR_RETURN(g, check_kv_cache(op, c.cache));
  const int64_t num_tokens = c.query.dim(0), num_heads = c.query.dim(1);
  if (c.query.dim(2) != g.head_dim) {
    return invalid_argument(s(op) + ": query has head_dim " + n(c.query.dim(2)) + " but the KV cache has head_dim " +
                            n(g.head_dim));
  }
  if (num_heads < 1 || num_heads % g.num_kv_heads != 0) {
    return invalid_argument(s(op) + ": query has " + n(num_heads) + " heads, which is not a positive multiple of the " +
                            "KV cache's " + n(g.num_kv_heads) + " kv heads");
  }
  if (!(std::isfinite(c.softmax_scale) && c.softmax_scale > 0.f)) {
    return invalid_argument(s(op) + ": softmax_scale is " + fmt_float(c.softmax_scale) + " but must be finite and > 0");
  }
  GB_RETURN_IF_ERROR(check_int32(op, "block_tables", c.block_tables, 2, "[num_seqs, max_blocks_per_seq]"));
  const int64_t num_seqs = c.block_tables.dim(0), max_blocks = c.block_tables.dim(1);
  GB_RETURN_IF_ERROR(check_int32(op, "context_lens", c.context_lens, 1, "[num_seqs]"));
  if (c.context_lens.dim(0) != num_seqs) {
    return invalid_argument(s(op) + ": context_lens has shape " + c.context_lens.shape_string() + " but must be [" +
                            n(num_seqs) + "] (num_seqs, the rows of block_tables)");
  }
  GB_RETURN_IF_ERROR(check_int32(op, "query_start_loc", c.query_start_loc, 1, "[num_seqs + 1]"));
  if (c.query_start_loc.dim(0) != num_seqs + 1) {
    return invalid_argument(s(op) + ": query_start_loc has shape " + c.query_start_loc.shape_string() +
                            " but must be [" + n(num_seqs + 1) + "] (num_seqs + 1)");
  }
  if (at_i32(c.query_start_loc, 0) != 0) {
    return invalid_argument(s(op) + ": query_start_loc[0] is " + n(at_i32(c.query_start_loc, 0)) + " but must be 0");
  }
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t b = at_i32(c.query_start_loc, q), e = at_i32(c.query_start_loc, q + 1);
    if (e < b) {
      return invalid_argument(s(op) + ": query_start_loc[" + n(q + 1) + "] = " + n(e) +
                              " is less than query_start_loc[" + n(q) + "] = " + n(b) + "; it must be non-decreasing");
    }
  }
  if (at_i32(c.query_start_loc, num_seqs) != num_tokens) {
    return invalid_argument(s(op) + ": query_start_loc[" + n(num_seqs) + "] is " +
                            n(at_i32(c.query_start_loc, num_seqs)) + " but must equal the number of query tokens " +
                            n(num_tokens));
  }
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t q_len = at_i32(c.query_start_loc, q + 1) - at_i32(c.query_start_loc, q);
    const int64_t ctx = at_i32(c.context_lens, q);
    if (ctx < q_len) {
      return invalid_argument(s(op) + ": sequence " + n(q) + " has " + n(q_len) + " query tokens but context length " +
                              n(ctx) + "; the context includes the query tokens");
    }
    if (ctx > max_blocks * g.block_size) {
      return invalid_argument(s(op) + ": sequence " + n(q) + " has context length " + n(ctx) +
                              " but block_tables holds " + n(max_blocks) + " blocks of " + n(g.block_size) +
                              " tokens (" + n(max_blocks * g.block_size) + ")");
    }
    if (q_len == 0) continue;  // nothing reads this sequence's blocks
    const int64_t used = (ctx + g.block_size - 1) / g.block_size;
    for (int64_t b = 0; b < used; ++b) {
      const int64_t block = at_i32(c.block_tables, q, b);
      if (block < 0 || block >= g.num_blocks) {
        return invalid_argument(s(op) + ": block_tables[" + n(q) + "][" + n(b) + "] = " + n(block) +
                                " is not a block of the KV cache (num_blocks = " + n(g.num_blocks) + ")");
      }
    }
  }
  return ok_status();
}

}  // namespace

std::string supported_head_dims_text() {
  std::string t;
  for (int64_t d : kPagedDecodeHeadDims) t += (t.empty() ? "" : ",") + std::to_string(d);
  return t;
}

Status run_paged_decode(const PagedDecodeCall& c) {
  KvGeometry g;
  GB_RETURN_IF_ERROR(validate(c, g));
  return with_head_dim(c.op, g.head_dim, [&]<int D>() -> Status {
    Plan p{&c,
           g,
           c.query.dim(1) / g.num_kv_heads,
           static_cast<const uint8_t*>(c.cache.key_cache.data()),
           static_cast<const uint8_t*>(c.cache.value_cache.data()),
           nullptr,
           nullptr};
    if (c.cache.format == KvCacheFormat::kInt8Fp16Scale) {
      p.key_scales = c.cache.key_scale_cache.data_as<const fp16_t>();
      p.value_scales = c.cache.value_scale_cache.data_as<const fp16_t>();
    }
    // Work items, heaviest first so that dynamic scheduling ends evenly (order never affects results).
    // The list is reused across calls (grows once).
    thread_local std::vector<Item> items;
    items.clear();
    const int64_t num_seqs = c.block_tables.dim(0);
    int64_t total_work = 0;
    for (int64_t q = 0; q < num_seqs; ++q) {
      const int64_t q_len = at_i32(c.query_start_loc, q + 1) - at_i32(c.query_start_loc, q);
      const int64_t ctx = at_i32(c.context_lens, q);
      const int64_t rows = q_len * p.group;
      for (int64_t h = 0; h < g.num_kv_heads; ++h) {
        for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
          const int32_t cnt = static_cast<int32_t>(std::min<int64_t>(kMaxRows, rows - r0));
          const int64_t last_t = (r0 + cnt - 1) / p.group;
          const int64_t keys = ctx - q_len + last_t + 1;
          items.push_back({static_cast<int32_t>(q), static_cast<int32_t>(h), static_cast<int32_t>(r0), cnt, keys});
          total_work += keys * (cnt + 1);
        }
      }
    }
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.num_keys > b.num_keys; });
    const int64_t num_items = static_cast<int64_t>(items.size());
    const size_t scratch_floats = paged::scratch_floats(D);
    const auto attend = GB_DISPATCH(AttendItem);  // the CPU target's kernel, chosen once per call

    const int threads = static_cast<int>(std::min<int64_t>(num_threads(), num_items));
    // Per-thread scratch grows once and is reused: steady-state calls do not allocate.
    auto scratch = [&]() -> float* {
      thread_local std::vector<float> buf;
      if (buf.size() < scratch_floats) buf.resize(scratch_floats);
      return buf.data();
    };
    if (threads <= 1 || total_work * D < (int64_t{1} << 18)) {
      float* buf = scratch();
      for (int64_t i = 0; i < num_items; ++i) attend(p, items[i], buf);
      return ok_status();
    }
    const std::vector<Item>& work = items;  // the caller's thread_local list, shared with the pool
    genbridge::detail::parallel_for_dynamic(num_items, [&](int64_t i) { attend(p, work[i], scratch()); });
    return ok_status();
  });
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
