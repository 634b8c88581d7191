// The MLA kernel (mla_attention.h), compiled once per CPU target with Highway; every target computes the
// same IEEE operations per output element (Fma16 is fused everywhere, reductions in the 16-lane order).
#ifndef GENBRIDGE_OPS_ATTENTION_MLA_ATTENTION_SHARED_
#define GENBRIDGE_OPS_ATTENTION_MLA_ATTENTION_SHARED_

#include "ops/common/attention/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "ops/common/kv_cache/kv_layout.h"
#include "ops/common/kv_cache/mla_layout.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail::mla {

constexpr int kTile = 16;   // list entries per online-softmax step
constexpr int kHeads = 8;  // query heads per work item (they share every decoded KV row; 16 heads = 2 items)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

struct Item {
  int32_t token;     // query token index
  int32_t seq;       // its sequence
  int32_t position;  // its position in the sequence
  int32_t head0;
  int32_t heads;
};

struct Plan {
  const MlaAttentionCall* call;
  TokenCacheGeometry g;
  int64_t num_heads;
  int64_t lp, rp, w;  // latent and rope widths rounded up to 16, and their sum
  TokenCacheGeometry g2;  // shared_kv: the second list's cache (its geometry; unused when that list is empty)
  int64_t vw = 0;         // accumulated value width: lp (MLA: V = latent) or w (shared KV: V = the whole row)
};

// Scratch floats of one item: q rows, acc rows, the decoded tile, per-head m and l, the tile's scores.
inline size_t scratch_floats(const Plan& p) {
  return static_cast<size_t>(kHeads * p.w + kHeads * p.w + (kTile + 4) * p.w + 2 * kHeads + kTile + 16 * kTile);
}

}  // namespace genbridge::ops::detail::mla
#endif  // GENBRIDGE_OPS_ATTENTION_MLA_ATTENTION_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/attention/mla_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/attention/vec_math-inl.h"
#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();
namespace {
using mla::Item;
using mla::kHeads;
using mla::kNegInf;
using mla::kTile;
using mla::Plan;

// n (< 16 or not) float-ish elements to fp32, zero-padded to a multiple of 16.
template <typename T>
HWY_INLINE void WidenPadded(const T* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) Store16(dst + i, Load16(src + i));
  if (i < n) Store16(dst + i, LoadTail16(src + i, n - i));
}

HWY_INLINE V16 LoadI8_16(const int8_t* p) {
  V16 r;
  GB_UNROLL for (int i = 0; i < kParts; ++i) r.p[i] = LoadI8Part(reinterpret_cast<const uint8_t*>(p) + i * kPart);
  return r;
}

// Decodes the cached row of flat slot `slot` of cache `c` (rows of row_bytes) into dst[0, w): latent
// (padded to lp), then rope (padded).
HWY_INLINE void DecodeRow(const Plan& p, const MlaKvCache& c, int64_t row_bytes, int64_t slot, float* dst) {
  const int64_t L = p.g.width, R = p.g.rope_dim;
  const uint8_t* row = static_cast<const uint8_t*>(c.kv_cache.data()) + slot * row_bytes;
  switch (c.format) {
    case MlaKvFormat::kBf16: {
      const bf16_t* b = reinterpret_cast<const bf16_t*>(row);
      WidenPadded(b, L, dst);
      WidenPadded(b + L, R, dst + p.lp);
      return;
    }
    case MlaKvFormat::kInt8Fp16ScaleSplitRope: {
      const int8_t* codes = reinterpret_cast<const int8_t*>(row);
      const float scale = fp16_to_float(c.scale_cache.data_as<const fp16_t>()[slot]);
      const V16 vs = Set16(scale);
      int64_t i = 0;
      for (; i + kLanes <= L; i += kLanes) Store16(dst + i, LoadI8_16(codes + i) * vs);
      for (; i < L; ++i) dst[i] = static_cast<float>(codes[i]) * scale;
      for (; i < p.lp; ++i) dst[i] = 0.f;
      WidenPadded(c.rope_cache.data_as<const bf16_t>() + slot * R, R, dst + p.lp);
      return;
    }
    case MlaKvFormat::kFp8TileScalePacked: {
      const uint8_t* scales = row + L;
      for (int64_t t = 0; t < L / kMlaKvScaleTile; ++t) {
        float scale;
        std::memcpy(&scale, scales + 4 * t, sizeof scale);
        const V16 vs = Set16(scale * 256.0f);  // the decoder yields code * 2^-8, exactly
        for (int64_t i = t * kMlaKvScaleTile; i < (t + 1) * kMlaKvScaleTile; i += kLanes) {
          Store16(dst + i, LoadFp8Scaled16(row + i) * vs);
        }
      }
      WidenPadded(reinterpret_cast<const bf16_t*>(scales + 4 * (L / kMlaKvScaleTile)), R, dst + p.lp);
      return;
    }
    case MlaKvFormat::kMxfp8RopeFirstPacked: {
      WidenPadded(reinterpret_cast<const bf16_t*>(row), R, dst + p.lp);
      const uint8_t* codes = row + 2 * R;
      const uint8_t* scales = codes + L;
      for (int64_t t = 0; t < L / kMxKvScaleGroup; ++t) {
        // code * 2^-8 from the decoder, times 2^(byte - 127) * 2^8: both powers of two, so exact.
        const V16 vs = Set16(e8m0_to_float(e8m0_t{scales[t]}) * 256.0f);
        for (int64_t i = t * kMxKvScaleGroup; i < (t + 1) * kMxKvScaleGroup; i += kLanes) {
          Store16(dst + i, LoadFp8Scaled16(codes + i) * vs);
        }
      }
      return;
    }
  }
}

// Row `r` (over the leading two dims) of a rank-3 float tensor as fp32, zero-padded to `padded`.
HWY_INLINE void LoadPadded(const TensorView& t, int64_t r, int64_t n, int64_t padded, float* dst) {
  if (n > 0) {
    if (t.stride(2) == 1 || n == 1) {
      const auto* src = static_cast<const uint8_t*>(t.data()) + row_offset(t, 1, r) * dtype_size(t.dtype());
      LoadRowF32Contiguous(t.dtype(), src, n, dst);
    } else {
      load_row_f32(t, 1, r, n, dst);
    }
  }
  for (int64_t i = n; i < padded; ++i) dst[i] = 0.f;
}

// The flat slot of list entry `e` of the item (dense: position e; sparse: as the index format says).
HWY_INLINE int64_t EntrySlot(const Plan& p, const Item& it, int64_t e) {
  const MlaAttentionCall& c = *p.call;
  if (c.sparse && c.index_format == TopkIndexFormat::kFlatKvSlots) return e;
  const int64_t bs = p.g.block_size;
  return int64_t{at_i32(c.block_tables, it.seq, e / bs)} * bs + e % bs;
}

void AttendItem(const Plan& p, const Item& it, float* scratch) {
  const MlaAttentionCall& c = *p.call;
  const int64_t L = p.g.width, R = p.g.rope_dim, lp = p.lp, w = p.w, vw = p.vw;
  const int nh = it.heads;
  float* q = scratch;                 // [kHeads][w]
  float* acc = q + kHeads * w;        // [kHeads][vw]
  float* kv = acc + kHeads * w;       // [kTile][w]
  float* m = kv + kTile * w;          // [kHeads]
  float* l = m + kHeads;              // [kHeads]
  float* scores = l + kHeads;         // [kTile]
  float* part = scores + kTile;       // [kTile][16] partial dots
  for (int h = 0; h < nh; ++h) {
    const int64_t r = int64_t{it.token} * p.num_heads + it.head0 + h;
    LoadPadded(c.q_latent, r, L, lp, q + h * w);
    LoadPadded(c.q_rope, r, R, p.rp, q + h * w + lp);
    std::memset(acc + h * vw, 0, static_cast<size_t>(vw) * sizeof(float));
    m[h] = kNegInf;
    l[h] = 0.f;
  }
  const V16 vscale = Set16(c.softmax_scale);
  // The list: dense = positions 0..position; sparse = row `token` of topk_indices without the -1 entries;
  // shared KV = that row (flat slots of cache), then row `token` of indices2 (flat slots of cache2).
  const int64_t len1 = c.sparse ? c.topk_indices.dim(1) : int64_t{it.position} + 1;
  const int64_t list_len = len1 + (c.shared_kv ? c.indices2.dim(1) : 0);
  int64_t next = 0;
  while (next < list_len) {
    int n = 0;
    while (n < kTile && next < list_len) {
      int64_t e = next++;
      if (e >= len1) {
        const int64_t slot = at_i32(c.indices2, it.token, e - len1);
        if (slot < 0) continue;
        DecodeRow(p, c.cache2, p.g2.row_bytes, slot, kv + n * w);
        ++n;
        continue;
      }
      if (c.sparse) {
        e = at_i32(c.topk_indices, it.token, e);
        if (e < 0) continue;
      }
      DecodeRow(p, c.cache, p.g.row_bytes, EntrySlot(p, it, e), kv + n * w);
      ++n;
    }
    if (n == 0) break;
    for (int h = 0; h < nh; ++h) {
      const float* qh = q + h * w;
      // 16-lane fused dots, four keys at a time (each key's own accumulator: the same operations as one
      // at a time), then the 16 sums in the contract's pairwise order (ReduceKeys16 = ReduceAdd16 per key).
      for (int j = 0; j < kTile; j += 4) DotFourKeys16(qh, kv + j * w, w, j < n ? w : 0, part + 16 * j);
      ReduceKeys16(part, scores);
      for (int j = n; j < kTile; ++j) scores[j] = kNegInf;
      const V16 s = Load16(scores) * vscale;
      const float tile_max = ReduceMaxSeq16(s);
      const float m_new = tile_max > m[h] ? tile_max : m[h];
      const V16 pw = ExpNonpositive16(s - Set16(m_new));
      const float alpha = Lane16(ExpNonpositive16(Set16(m[h] - m_new)), 0);
      l[h] = l[h] * alpha + ReduceAdd16(pw);
      m[h] = m_new;
      float* ah = acc + h * vw;
      alignas(64) float pj[kTile];
      Store16(pj, pw);
      // acc = acc * alpha, then acc = fma(p_j, v_j, acc) for j in list order: per element the same
      // sequence of operations as token by token, with acc kept in registers across the tile.
      const bool rescale = alpha != 1.0f;
      const V16 va = Set16(alpha);
      for (int64_t i = 0; i < vw; i += kLanes) {
        V16 a = Load16(ah + i);
        if (rescale) a = a * va;
        for (int j = 0; j < n; ++j) a = Fma16(Set16(pj[j]), Load16(kv + j * w + i), a);
        Store16(ah + i, a);
      }
    }
  }
  // out = acc / l (0 for an empty list). A sink s adds exp(s) to the denominator: m' = max(m, s), acc and l
  // rescaled by exp(m - m'), l += exp(s - m').
  const bool sinks = c.shared_kv && c.sinks.rank() == 1;
  for (int h = 0; h < nh; ++h) {
    float* ah = acc + h * vw;
    if (sinks) {
      const float sink = c.sinks.data_as<const float>()[it.head0 + h];
      const float m_new = sink > m[h] ? sink : m[h];
      const float alpha = Lane16(ExpNonpositive16(Set16(m[h] - m_new)), 0);
      const float ps = Lane16(ExpNonpositive16(Set16(sink - m_new)), 0);
      if (alpha != 1.0f) {
        const V16 va = Set16(alpha);
        for (int64_t i = 0; i < vw; i += kLanes) Store16(ah + i, Load16(ah + i) * va);
      }
      l[h] = l[h] * alpha + ps;
    }
    if (l[h] > 0.f) {
      const V16 vl = Set16(l[h]);
      for (int64_t i = 0; i < vw; i += kLanes) Store16(ah + i, Load16(ah + i) / vl);
    } else {
      std::memset(ah, 0, static_cast<size_t>(vw) * sizeof(float));
    }
    const int64_t r = int64_t{it.token} * p.num_heads + it.head0 + h;
    const float* row = ah;
    int64_t width = L;
    if (c.shared_kv) {  // latent then rope, contiguous (the tile is free now)
      std::memcpy(kv, ah, static_cast<size_t>(L) * sizeof(float));
      std::memcpy(kv + L, ah + lp, static_cast<size_t>(R) * sizeof(float));
      row = kv;
      width = L + R;
    }
    if (c.out.stride(2) == 1 || width == 1) {
      auto* dst = static_cast<uint8_t*>(c.out.data()) + row_offset(c.out, 1, r) * dtype_size(c.out.dtype());
      StoreRowF32Contiguous(c.out.dtype(), dst, width, row);
    } else {
      store_row_f32(c.out, 1, r, width, row);
    }
  }
}

}  // namespace
GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(AttendItem);

namespace {

Status check_q(const char* op, const char* name, const TensorView& t, int64_t width, const char* width_name) {
  GB_RETURN_IF_ERROR(check_float_input(op, name, t));
  if (t.rank() != 3 || t.dim(2) != width) {
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() +
                            " but must be [num_query_tokens, num_heads, " + width_name + " = " + n(width) + "]");
  }
  return ok_status();
}

// The queries, out and softmax_scale of either form: q_name names q_latent ("q_latent" / "q_nope"); out is
// [tokens, heads, out_width], `out_what` says what that width is.
Status check_queries_and_out(const MlaAttentionCall& c, const TokenCacheGeometry& g, const char* q_name,
                             int64_t out_width, const char* out_what) {
  const char* op = c.op;
  GB_RETURN_IF_ERROR(check_q(op, q_name, c.q_latent, g.width, "kv_lora_rank"));
  GB_RETURN_IF_ERROR(check_q(op, "q_rope", c.q_rope, g.rope_dim, "rope_dim"));
  const int64_t num_tokens = c.q_latent.dim(0), num_heads = c.q_latent.dim(1);
  if (c.q_rope.dim(0) != num_tokens || c.q_rope.dim(1) != num_heads) {
    return invalid_argument(s(op) + ": q_rope has shape " + c.q_rope.shape_string() + " but " + q_name +
                            " has shape " + c.q_latent.shape_string() + "; they must agree in tokens and heads");
  }
  if (num_heads < 1) return invalid_argument(s(op) + ": " + q_name + " has " + n(num_heads) + " heads; must be >= 1");
  if (c.out.dtype() != DType::kF32 && c.out.dtype() != DType::kBF16) {
    return invalid_argument(s(op) + ": out has dtype " + s(dtype_name(c.out.dtype())) + " but must be fp32 or bf16");
  }
  if (c.out.rank() != 3 || c.out.dim(0) != num_tokens || c.out.dim(1) != num_heads || c.out.dim(2) != out_width) {
    return invalid_argument(s(op) + ": out has shape " + c.out.shape_string() + " but must be [" + n(num_tokens) + ", " +
                            n(num_heads) + ", " + n(out_width) + "] (" + out_what + ")");
  }
  GB_RETURN_IF_ERROR(check_host_data(op, "out", c.out));
  if (!(std::isfinite(c.softmax_scale) && c.softmax_scale > 0.f)) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", static_cast<double>(c.softmax_scale));
    return invalid_argument(s(op) + ": softmax_scale is " + text + " but must be finite and > 0");
  }
  return ok_status();
}

Status validate(const MlaAttentionCall& c, TokenCacheGeometry& g) {
  const char* op = c.op;
  GB_ASSIGN_OR_RETURN(g, check_mla_cache(op, c.cache));
  GB_RETURN_IF_ERROR(check_queries_and_out(c, g, "q_latent", g.width, "q_latent's shape"));
  const int64_t num_tokens = c.q_latent.dim(0);
  GB_RETURN_IF_ERROR(check_attention_batch(op, c.block_tables, c.context_lens, c.query_start_loc, num_tokens,
                                           g.num_blocks, g.block_size));
  if (!c.sparse) return ok_status();
  GB_RETURN_IF_ERROR(check_int32(op, "topk_indices", c.topk_indices, 2, "[num_query_tokens, index_topk]"));
  if (c.topk_indices.dim(0) != num_tokens) {
    return invalid_argument(s(op) + ": topk_indices has shape " + c.topk_indices.shape_string() + " but must have " +
                            n(num_tokens) + " rows (one per query token)");
  }
  const int64_t k = c.topk_indices.dim(1);
  const int64_t num_seqs = c.block_tables.dim(0);
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t b = at_i32(c.query_start_loc, q), e = at_i32(c.query_start_loc, q + 1);
    const int64_t ctx = at_i32(c.context_lens, q);
    for (int64_t t = b; t < e; ++t) {
      const int64_t pos = ctx - (e - b) + (t - b);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t v = at_i32(c.topk_indices, t, j);
        if (v == -1) continue;
        if (c.index_format == TopkIndexFormat::kSequencePositions) {
          if (v < 0 || v > pos) {
            return invalid_argument(s(op) + ": topk_indices[" + n(t) + "][" + n(j) + "] = " + n(v) +
                                    " is not a position the query may see: sequence positions must be in [0, " +
                                    n(pos) + "] (or -1 for padding)");
          }
        } else if (v < 0 || v >= g.num_slots()) {
          return invalid_argument(s(op) + ": topk_indices[" + n(t) + "][" + n(j) + "] = " + n(v) +
                                  " is not a KV slot: flat slots must be in [0, " + n(g.num_slots()) +
                                  ") (num_blocks * block_size) or -1 for padding");
        }
      }
    }
  }
  return ok_status();
}

// Flat-slot list `name` ([num_tokens, n] int32): every entry -1 or a slot of a cache of num_slots slots.
Status check_slot_list(const char* op, const char* name, const TensorView& t, int64_t num_tokens, int64_t num_slots,
                       const char* cache_name) {
  GB_RETURN_IF_ERROR(check_int32(op, name, t, 2, "[num_query_tokens, n]"));
  if (t.dim(0) != num_tokens) {
    return invalid_argument(s(op) + ": " + name + " has shape " + t.shape_string() + " but must have " + n(num_tokens) +
                            " rows (one per query token)");
  }
  for (int64_t i = 0; i < num_tokens; ++i) {
    for (int64_t j = 0; j < t.dim(1); ++j) {
      const int64_t v = at_i32(t, i, j);
      if (v != -1 && (v < 0 || v >= num_slots)) {
        return invalid_argument(s(op) + ": " + name + "[" + n(i) + "][" + n(j) + "] = " + n(v) + " is not a slot of " +
                                cache_name + ": flat slots must be in [0, " + n(num_slots) +
                                ") (num_blocks * block_size) or -1 for padding");
      }
    }
  }
  return ok_status();
}

Status validate_shared_kv(const MlaAttentionCall& c, TokenCacheGeometry& g, TokenCacheGeometry& g2) {
  const char* op = c.op;
  GB_ASSIGN_OR_RETURN(g, check_mla_cache(op, c.cache));
  GB_RETURN_IF_ERROR(
      check_queries_and_out(c, g, "q_nope", g.width + g.rope_dim, "tokens, heads, kv_lora_rank + rope_dim"));
  const int64_t num_tokens = c.q_latent.dim(0), num_heads = c.q_latent.dim(1);
  GB_RETURN_IF_ERROR(check_slot_list(op, "window_slots", c.topk_indices, num_tokens, g.num_slots(), "window_cache"));
  GB_RETURN_IF_ERROR(check_int32(op, "compressed_slots", c.indices2, 2, "[num_query_tokens, n]"));
  if (c.indices2.dim(1) > 0) {
    const std::string op2 = s(op) + " (compressed_cache)";
    GB_ASSIGN_OR_RETURN(g2, check_mla_cache(op2.c_str(), c.cache2));
    if (g2.width != g.width || g2.rope_dim != g.rope_dim) {
      return invalid_argument(s(op) + ": compressed_cache holds rows of " + n(g2.width) + " + " + n(g2.rope_dim) +
                              " but window_cache rows of " + n(g.width) + " + " + n(g.rope_dim) +
                              " (kv_lora_rank + rope_dim); they must agree");
    }
    GB_RETURN_IF_ERROR(
        check_slot_list(op, "compressed_slots", c.indices2, num_tokens, g2.num_slots(), "compressed_cache"));
  } else if (c.indices2.dim(0) != num_tokens) {
    return invalid_argument(s(op) + ": compressed_slots has shape " + c.indices2.shape_string() + " but must have " +
                            n(num_tokens) + " rows (one per query token)");
  }
  if (c.sinks.rank() != 0) {
    if (c.sinks.dtype() != DType::kF32 || c.sinks.rank() != 1 || c.sinks.dim(0) != num_heads ||
        !c.sinks.is_contiguous()) {
      return invalid_argument(s(op) + ": sinks has dtype " + s(dtype_name(c.sinks.dtype())) + " and shape " +
                              c.sinks.shape_string() + " but must be contiguous fp32 [" + n(num_heads) + "] (num_heads)");
    }
    GB_RETURN_IF_ERROR(check_host_data(op, "sinks", c.sinks));
    for (int64_t h = 0; h < num_heads; ++h) {
      const float v = c.sinks.data_as<const float>()[h];
      if (!std::isfinite(v)) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", static_cast<double>(v));
        return invalid_argument(s(op) + ": sinks[" + n(h) + "] is " + text + " but must be finite");
      }
    }
  }
  return ok_status();
}

// Runs the kernel over `items` (on the pool when the work is large enough).
Status execute(const mla::Plan& p, const std::vector<mla::Item>& items, int64_t total_work) {
  const int64_t num_items = static_cast<int64_t>(items.size());
  if (num_items == 0) return ok_status();
  const size_t floats = mla::scratch_floats(p);
  auto scratch = [&]() -> float* {
    thread_local std::vector<float> buf;
    if (buf.size() < floats) buf.resize(floats);
    return buf.data();
  };
  const auto attend = GB_DISPATCH(AttendItem);
  const int threads = static_cast<int>(std::min<int64_t>(num_threads(), num_items));
  if (threads <= 1 || total_work * p.w < (int64_t{1} << 18)) {
    float* buf = scratch();
    for (int64_t i = 0; i < num_items; ++i) attend(p, items[i], buf);
    return ok_status();
  }
  genbridge::detail::parallel_for_dynamic(num_items, [&](int64_t i) { attend(p, items[i], scratch()); });
  return ok_status();
}

}  // namespace

Status run_sharedkv_attention(const MlaAttentionCall& c) {
  TokenCacheGeometry g, g2;
  GB_RETURN_IF_ERROR(validate_shared_kv(c, g, g2));
  mla::Plan p{&c, g, c.q_latent.dim(1), mla::round16(g.width), mla::round16(g.rope_dim), 0};
  p.w = p.lp + p.rp;
  p.g2 = g2;
  p.vw = p.w;
  thread_local std::vector<mla::Item> items;
  items.clear();
  const int64_t num_tokens = c.q_latent.dim(0);
  const int64_t list = c.topk_indices.dim(1) + c.indices2.dim(1);
  int64_t total_work = 0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t h0 = 0; h0 < p.num_heads; h0 += mla::kHeads) {
      const int32_t cnt = static_cast<int32_t>(std::min<int64_t>(mla::kHeads, p.num_heads - h0));
      items.push_back({static_cast<int32_t>(t), 0, 0, static_cast<int32_t>(h0), cnt});
      total_work += list * (cnt + 1);
    }
  }
  return execute(p, items, total_work);
}

Status run_mla_attention(const MlaAttentionCall& c) {
  TokenCacheGeometry g;
  GB_RETURN_IF_ERROR(validate(c, g));
  mla::Plan p{&c, g, c.q_latent.dim(1), mla::round16(g.width), mla::round16(g.rope_dim), 0};
  p.w = p.lp + p.rp;
  p.vw = p.lp;
  thread_local std::vector<mla::Item> items;
  items.clear();
  const int64_t num_seqs = c.block_tables.dim(0);
  int64_t total_work = 0;
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t b = at_i32(c.query_start_loc, q), e = at_i32(c.query_start_loc, q + 1);
    const int64_t ctx = at_i32(c.context_lens, q);
    for (int64_t t = b; t < e; ++t) {
      const int64_t pos = ctx - (e - b) + (t - b);
      for (int64_t h0 = 0; h0 < p.num_heads; h0 += mla::kHeads) {
        const int32_t cnt = static_cast<int32_t>(std::min<int64_t>(mla::kHeads, p.num_heads - h0));
        items.push_back({static_cast<int32_t>(t), static_cast<int32_t>(q), static_cast<int32_t>(pos),
                         static_cast<int32_t>(h0), cnt});
        total_work += (c.sparse ? c.topk_indices.dim(1) : pos + 1) * (cnt + 1);
      }
    }
  }
  return execute(p, items, total_work);
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
