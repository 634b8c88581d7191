#include "ops/detail/attention/paged_attention.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "core/vec.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "ops/detail/kv_cache/kv_layout.h"
#include "ops/detail/common/rows.h"
#include "ops/detail/attention/vec_math.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

#ifdef _OPENMP
#endif

namespace genbridge::ops::detail {
namespace {

std::string s(std::string_view v) { return std::string(v); }
std::string n(int64_t v) { return std::to_string(v); }
std::string fmt_float(float v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(v));
  return text;
}

constexpr int kMaxRows = 16;  // query rows (query token x query head of one kv head) per work item
constexpr int kChunk = 64;    // keys per online-softmax step; chunk boundaries are multiples of 64
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

// ---- per-format row readers ----

template <int D, KvCacheFormat F>
struct KvRows {
  static constexpr bool kScaled = F != KvCacheFormat::kBf16;
  // Columns are processed 32 at a time as two 16-lane vectors. bf16 rows are split into their even and
  // odd elements (one shift and one mask of the 64-byte line, instead of widening each half), so q and
  // the output accumulators use the same "pair-interleaved" column order; the other formats keep the
  // natural order. Either way the order is fixed, so results stay the same on every ISA.
  static constexpr bool kPairInterleaved = F == KvCacheFormat::kBf16;
  // Columns come in kPairs full pairs of 32; head dims that are 16 more than a multiple of 32 (80, 112)
  // end with one group of 16, kept in natural order in every format.
  static constexpr int kPairs = D / 32;
  static constexpr bool kTail = D % 32 != 0;
  static_assert(D % 32 == 0 || D % 32 == 16, "head_dim must be a multiple of 16");
  // Columns [32p, 32p + 32) of a row as fp32 (fp8: times 2^-8, compensated in scale()).
  static void load_pair(const uint8_t* row, int p, vec::f32x16& lo, vec::f32x16& hi) {
    if constexpr (F == KvCacheFormat::kBf16) {
      u32x16 u;
      std::memcpy(&u, row + 64 * p, sizeof u);
      lo = bits_to_f32(u << 16);                    // elements 32p + 0, 2, 4, ...
      hi = bits_to_f32(u & 0xffff0000u);            // elements 32p + 1, 3, 5, ...
    } else if constexpr (F == KvCacheFormat::kInt8Fp16Scale) {
      lo = load_i8(row + 32 * p);
      hi = load_i8(row + 32 * p + 16);
    } else {
      lo = load_fp8_e4m3fn_scaled(row + 32 * p);
      hi = load_fp8_e4m3fn_scaled(row + 32 * p + 16);
    }
  }
  // The tail columns [32 * kPairs, D) of a row as fp32, natural order (fp8: times 2^-8).
  static vec::f32x16 load_tail(const uint8_t* row) {
    if constexpr (F == KvCacheFormat::kBf16) {
      return vec::load(reinterpret_cast<const bf16_t*>(row + 64 * kPairs));
    } else if constexpr (F == KvCacheFormat::kInt8Fp16Scale) {
      return load_i8(row + 32 * kPairs);
    } else {
      return load_fp8_e4m3fn_scaled(row + 32 * kPairs);
    }
  }
  // Reorders a row of D natural-order columns into the kernel's column order (and back); the tail stays.
  static void to_kernel_order(float* x) {
    if constexpr (kPairInterleaved) {
      float t[32];
      for (int p = 0; p < D / 32; ++p) {
        for (int i = 0; i < 16; ++i) t[i] = x[32 * p + 2 * i], t[16 + i] = x[32 * p + 2 * i + 1];
        std::memcpy(x + 32 * p, t, sizeof t);
      }
    }
  }
  static void to_natural_order(float* x) {
    if constexpr (kPairInterleaved) {
      float t[32];
      for (int p = 0; p < D / 32; ++p) {
        for (int i = 0; i < 16; ++i) t[2 * i] = x[32 * p + i], t[2 * i + 1] = x[32 * p + 16 + i];
        std::memcpy(x + 32 * p, t, sizeof t);
      }
    }
  }
  static float scale(const uint8_t* row, const fp16_t* scales, int64_t r) {
    if constexpr (F == KvCacheFormat::kInt8Fp16Scale) {
#if defined(__F16C__)
      return _cvtsh_ss(scales[r].bits);  // exact, one instruction instead of the portable decoder
#else
      return fp16_to_float(scales[r]);
#endif
    } else if constexpr (F == KvCacheFormat::kFp8Fp32PackedScale) {
      float sc;
      std::memcpy(&sc, row + D, sizeof sc);
      return sc * 256.0f;  // exact: undoes the 2^-8 of load_fp8_e4m3fn_scaled
    } else {
      (void)row, (void)scales, (void)r;
      return 1.0f;
    }
  }
};

// Calls fn.template operator()<NR>(r0) over [0, rows) in register blocks of 4, 2 and 1 rows.
template <typename Fn>
inline void for_row_blocks4(int rows, Fn&& fn) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) fn.template operator()<4>(r);
  if (r + 2 <= rows) fn.template operator()<2>(r), r += 2;
  if (r < rows) fn.template operator()<1>(r);
}

// Calls fn.template operator()<NR>(r0) over [0, rows) in register blocks of 8, 4, 2 and 1 rows.
template <typename Fn>
inline void for_row_blocks(int rows, Fn&& fn) {
  int r = 0;
  for (; r + 8 <= rows; r += 8) fn.template operator()<8>(r);
  if (r + 4 <= rows) fn.template operator()<4>(r), r += 4;
  if (r + 2 <= rows) fn.template operator()<2>(r), r += 2;
  if (r < rows) fn.template operator()<1>(r);
}

template <int D, KvCacheFormat F>
void attend(const Plan& p, const Item& it, std::vector<float>& scratch) {
  using Rows = KvRows<D, F>;
  constexpr int C = D / 16;               // 16-column chunks
  constexpr int CP = 2 * Rows::kPairs;    // chunks in full pairs; C - CP = 1 when there is a tail
  const PagedDecodeCall& c = *p.call;
  const KvGeometry& g = p.g;
  const int nr = it.row_count;

  // Scratch: q and acc rows, chunk weights.
  float* q = scratch.data();                   // [kMaxRows][D]
  float* acc = q + kMaxRows * D;               // [kMaxRows][D]
  float* w = acc + kMaxRows * D;               // [kMaxRows][kChunk]
  float m[kMaxRows], l[kMaxRows];
  int64_t pos[kMaxRows], token[kMaxRows], head[kMaxRows];
  alignas(64) float kscale[kChunk], vscale[kChunk];
  const uint8_t* krow[kChunk];
  const uint8_t* vrow[kChunk];

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
    Rows::to_kernel_order(qr);
    m[r] = kNegInf;
    l[r] = 0.f;
    std::fill(acc + r * D, acc + (r + 1) * D, 0.f);
  }

  for (int64_t j0 = 0; j0 < num_keys; j0 += kChunk) {
    const int cn = static_cast<int>(std::min<int64_t>(kChunk, num_keys - j0));
    for (int k = 0; k < cn; ++k) {
      const int64_t j = j0 + k;
      const int64_t block = at_i32(c.block_tables, it.seq, j / g.block_size);
      const int64_t r = g.row(block, it.kv_head, j % g.block_size);
      krow[k] = p.key_base + r * g.row_bytes;
      vrow[k] = p.value_base + r * g.row_bytes;
      kscale[k] = Rows::scale(krow[k], p.key_scales, r);
      vscale[k] = Rows::scale(vrow[k], p.value_scales, r);
    }
    for (int k = cn; k < kChunk; ++k) kscale[k] = vscale[k] = 0.f;

    // Scores: 16 keys at a time; per (row, key) a 16-lane partial dot product, reduced for 16 keys at once.
    for (int k0 = 0; k0 < cn; k0 += 16) {
      const int kn = std::min(16, cn - k0);
      alignas(64) vec::f32x16 part[kMaxRows][16];
      for (int r = 0; r < nr; ++r) {
        for (int kk = kn; kk < 16; ++kk) part[r][kk] = vec::f32x16{};
      }
      // Two keys per step: each q chunk is loaded once for both, and 2 * NR accumulation chains are in
      // flight. The V rows of these keys are prefetched for the accumulation below.
      for (int kk = 0; kk < kn; kk += 2) {
        const bool pair = kk + 1 < kn;
        vec::f32x16 ka[C], kb[C];
        const uint8_t* ra = krow[k0 + kk];
        const uint8_t* rb = pair ? krow[k0 + kk + 1] : ra;
        for (int ci = 0; ci < CP; ci += 2) Rows::load_pair(ra, ci / 2, ka[ci], ka[ci + 1]);
        for (int ci = 0; ci < CP; ci += 2) Rows::load_pair(rb, ci / 2, kb[ci], kb[ci + 1]);
        if constexpr (Rows::kTail) {
          ka[CP] = Rows::load_tail(ra);
          kb[CP] = Rows::load_tail(rb);
        }
        for (int64_t b = 0; b < g.row_bytes; b += 64) {
          __builtin_prefetch(vrow[k0 + kk] + b);
          if (pair) __builtin_prefetch(vrow[k0 + kk + 1] + b);
        }
        for_row_blocks4(nr, [&]<int NR>(int r0) {
          vec::f32x16 a[NR], bacc[NR];
          for (int i = 0; i < NR; ++i) a[i] = bacc[i] = vec::f32x16{};
          for (int ci = 0; ci < C; ++ci) {
            for (int i = 0; i < NR; ++i) {
              const vec::f32x16 qc = vec::load(q + (r0 + i) * D + 16 * ci);
              a[i] += qc * ka[ci];
              bacc[i] += qc * kb[ci];
            }
          }
          for (int i = 0; i < NR; ++i) {
            part[r0 + i][kk] = a[i];
            if (pair) part[r0 + i][kk + 1] = bacc[i];
          }
        });
      }
      const vec::f32x16 ks = vec::load(kscale + k0);
      vec::i32x16 lane;
      for (int i = 0; i < 16; ++i) lane[i] = i;
      for (int r = 0; r < nr; ++r) {
        vec::f32x16 sc = transpose_reduce16(part[r]);
        if constexpr (Rows::kScaled) sc *= ks;
        const int64_t visible = std::min<int64_t>(kn, pos[r] - (j0 + k0) + 1);  // keys <= pos[r]
        sc = select(lane < static_cast<int32_t>(std::max<int64_t>(visible, 0)), sc, vec::splat(kNegInf));
        vec::store(w + r * kChunk + k0, sc);
      }
    }

    // Online softmax: rescale the running sums when the maximum grows. Masked keys weigh exactly 0, and
    // a chunk entirely beyond a row's position leaves that row bit for bit unchanged (alpha = exp(0) = 1).
    const int cn16 = (cn + 15) & ~15;
    for (int r = 0; r < nr; ++r) {
      float* wr = w + r * kChunk;
      vec::f32x16 mx = vec::splat(kNegInf);
      for (int k0 = 0; k0 < cn16; k0 += 16) mx = vmax(mx, vec::load(wr + k0));
      const float m_new = std::max(m[r], reduce_max(mx));
      const float alpha = exp_nonpositive(vec::splat(m[r] - m_new))[0];
      vec::f32x16 sum{};
      for (int k0 = 0; k0 < cn16; k0 += 16) {
        vec::f32x16 e = exp_nonpositive(vec::load(wr + k0) - m_new);
        sum += e;
        if constexpr (Rows::kScaled) e *= vec::load(vscale + k0);
        vec::store(wr + k0, e);
      }
      l[r] = l[r] * alpha + vec::reduce_add(sum);
      m[r] = m_new;
      if (alpha != 1.0f) {
        float* ar = acc + r * D;
        for (int i = 0; i < D; ++i) ar[i] *= alpha;
      }
    }

    // acc[r] += sum_k w[r][k] * v_k, keys in order, 32 columns at a time (one 64-byte bf16 line) with the
    // rows in registers: 2 * NR independent accumulation chains.
    for_row_blocks(nr, [&]<int NR>(int r0) {
      for (int ci = 0; ci < CP; ci += 2) {
        vec::f32x16 a0[NR], a1[NR];
        for (int i = 0; i < NR; ++i) {
          a0[i] = vec::load(acc + (r0 + i) * D + 16 * ci);
          a1[i] = vec::load(acc + (r0 + i) * D + 16 * ci + 16);
        }
        for (int k = 0; k < cn; ++k) {
          vec::f32x16 v0, v1;
          Rows::load_pair(vrow[k], ci / 2, v0, v1);
          for (int i = 0; i < NR; ++i) {
            const float wk = w[(r0 + i) * kChunk + k];
            a0[i] += wk * v0;
            a1[i] += wk * v1;
          }
        }
        for (int i = 0; i < NR; ++i) {
          vec::store(acc + (r0 + i) * D + 16 * ci, a0[i]);
          vec::store(acc + (r0 + i) * D + 16 * ci + 16, a1[i]);
        }
      }
      if constexpr (Rows::kTail) {  // the last 16 columns: one accumulation chain per row
        vec::f32x16 a0[NR];
        for (int i = 0; i < NR; ++i) a0[i] = vec::load(acc + (r0 + i) * D + 16 * CP);
        for (int k = 0; k < cn; ++k) {
          const vec::f32x16 v0 = Rows::load_tail(vrow[k]);
          for (int i = 0; i < NR; ++i) a0[i] += w[(r0 + i) * kChunk + k] * v0;
        }
        for (int i = 0; i < NR; ++i) vec::store(acc + (r0 + i) * D + 16 * CP, a0[i]);
      }
    });
  }

  for (int r = 0; r < nr; ++r) {
    float* ar = acc + r * D;
    for (int i = 0; i < D; ++i) ar[i] = ar[i] / l[r];
    Rows::to_natural_order(ar);
    store_row_f32(c.out, 1, token[r] * num_q_heads + head[r], D, ar);
  }
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
      return invalid_argument(s(op) + ": query_start_loc[" + n(q + 1) + "] = " + n(e) + " is less than query_start_loc[" +
                              n(q) + "] = " + n(b) + "; it must be non-decreasing");
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
    Plan p{&c, g, c.query.dim(1) / g.num_kv_heads, static_cast<const uint8_t*>(c.cache.key_cache.data()),
           static_cast<const uint8_t*>(c.cache.value_cache.data()), nullptr, nullptr};
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
    const size_t scratch_floats = static_cast<size_t>(2 * kMaxRows * D + kMaxRows * kChunk);

    auto run_items = [&]<KvCacheFormat F>() {
      const int threads = static_cast<int>(std::min<int64_t>(num_threads(), num_items));
      // Per-thread scratch grows once and is reused: steady-state calls do not allocate.
      auto scratch = [&]() -> std::vector<float>& {
        thread_local std::vector<float> buf;
        if (buf.size() < scratch_floats) buf.resize(scratch_floats);
        return buf;
      };
      if (threads <= 1 || total_work * D < (int64_t{1} << 18)) {
        std::vector<float>& buf = scratch();
        for (int64_t i = 0; i < num_items; ++i) attend<D, F>(p, items[i], buf);
        return;
      }
      const std::vector<Item>& work = items;  // the caller's thread_local list, shared with the pool
      genbridge::detail::parallel_for_dynamic(num_items, [&](int64_t i) { attend<D, F>(p, work[i], scratch()); });
    };
    switch (c.cache.format) {
      case KvCacheFormat::kBf16: run_items.template operator()<KvCacheFormat::kBf16>(); break;
      case KvCacheFormat::kInt8Fp16Scale: run_items.template operator()<KvCacheFormat::kInt8Fp16Scale>(); break;
      case KvCacheFormat::kFp8Fp32PackedScale:
        run_items.template operator()<KvCacheFormat::kFp8Fp32PackedScale>();
        break;
    }
    return ok_status();
  });
}

}  // namespace genbridge::ops::detail
