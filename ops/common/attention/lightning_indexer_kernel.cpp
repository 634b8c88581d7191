// The lightning indexer's kernel (lightning_indexer_kernel.h), scores compiled once per CPU target with
// Highway; the same IEEE operations per score on every target.
#ifndef GENBRIDGE_OPS_ATTENTION_LIGHTNING_INDEXER_SHARED_
#define GENBRIDGE_OPS_ATTENTION_LIGHTNING_INDEXER_SHARED_

#include "ops/common/attention/lightning_indexer_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "ops/common/attention/hadamard.h"
#include "ops/common/kv_cache/kv_layout.h"
#include "ops/common/kv_cache/mla_layout.h"
#include "ops/common/tensor/messages.h"
#include "ops/common/tensor/rows.h"

namespace genbridge::ops::detail::indexer {

constexpr int64_t kChunk = 256;  // positions per scoring work item (a multiple of 16)

struct Plan {
  const LightningIndexerCall* call;
  TokenCacheGeometry g;
  int64_t num_heads;
  int64_t dp;  // head_dim rounded up to 16
};

// One scoring work item: positions [p0, p1) of query token `token` (sequence `seq`), scores written
// to out[p0 - 0 ...] of that query's score row.
struct Item {
  int32_t token;
  int32_t seq;
  int64_t p0, p1;
  float* out;
};

}  // namespace genbridge::ops::detail::indexer
#endif  // GENBRIDGE_OPS_ATTENTION_LIGHTNING_INDEXER_SHARED_

#define HWY_TARGET_INCLUDE "ops/common/attention/lightning_indexer_kernel.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include "ops/common/attention/vec_math-inl.h"
#include "ops/common/tensor/kernels-inl.h"
#include "ops/common/tensor/rows-inl.h"

GB_OPS_KERNELS_BEGIN();
namespace {
using indexer::Item;
using indexer::Plan;

// Key of flat slot `slot` as fp32 in dst[0, dp) (zero padded).
HWY_INLINE void DecodeKey(const Plan& p, int64_t slot, float* dst) {
  const IndexerKeyCache& c = p.call->keys;
  const int64_t D = p.g.width;
  const uint8_t* row = static_cast<const uint8_t*>(c.key_cache.data()) + slot * p.g.row_bytes;
  if (c.format == IndexerKeyFormat::kBf16) {
    const bf16_t* b = reinterpret_cast<const bf16_t*>(row);
    int64_t i = 0;
    for (; i + kLanes <= D; i += kLanes) Store16(dst + i, Load16(b + i));
    if (i < D) Store16(dst + i, LoadTail16(b + i, D - i));
    return;
  }
  float scale;
  std::memcpy(&scale, row + D, sizeof scale);
  const V16 vs = Set16(scale * 256.0f);  // the decoder yields code * 2^-8, exactly
  int64_t i = 0;
  for (; i + kLanes <= D; i += kLanes) Store16(dst + i, LoadFp8Scaled16(row + i) * vs);
  if (i < D) {  // D < 16 only (a power of two)
    alignas(64) uint8_t tmp[kLanes] = {};
    std::memcpy(tmp, row + i, static_cast<size_t>(D - i));
    Store16(dst + i, LoadFp8Scaled16(tmp) * vs);
  }
}

// scratch: q [H][dp], w [H], keys [16][dp], partial dots [16][16], sums [16].
void ScoreItem(const Plan& p, const Item& it, float* scratch) {
  const LightningIndexerCall& c = *p.call;
  const int64_t H = p.num_heads, D = p.g.width, dp = p.dp, bs = p.g.block_size;
  float* q = scratch;
  float* w = q + H * dp;
  float* keys = w + H;
  float* part = keys + 16 * dp;
  float* sums = part + 256;
  const bool rotate = c.keys.format == IndexerKeyFormat::kFp8HadamardPackedScale;
  for (int64_t h = 0; h < H; ++h) {
    float* qh = q + h * dp;
    const int64_t r = int64_t{it.token} * H + h;
    if (c.q.stride(2) == 1 || D == 1) {
      const auto* src = static_cast<const uint8_t*>(c.q.data()) + row_offset(c.q, 1, r) * dtype_size(c.q.dtype());
      LoadRowF32Contiguous(c.q.dtype(), src, D, qh);
    } else {
      load_row_f32(c.q, 1, r, D, qh);
    }
    for (int64_t i = D; i < dp; ++i) qh[i] = 0.f;
    if (rotate) hadamard_rotate(qh, D);
  }
  load_row_f32(c.weights, 1, it.token, H, w);
  for (int64_t b0 = it.p0; b0 < it.p1; b0 += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, it.p1 - b0));
    for (int j = 0; j < 16; ++j) {
      float* kj = keys + j * dp;
      if (j < n) {
        const int64_t pos = b0 + j;
        const int64_t slot = int64_t{at_i32(c.block_tables, it.seq, pos / bs)} * bs + pos % bs;
        DecodeKey(p, slot, kj);
      } else {
        std::memset(kj, 0, static_cast<size_t>(dp) * sizeof(float));
      }
    }
    V16 score = Zero16();
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + h * dp;
      for (int j = 0; j < 16; j += 4) DotFourKeys16(qh, keys + j * dp, dp, dp, part + 16 * j);
      ReduceKeys16(part, sums);
      const V16 relu = MaxGt16(Load16(sums), Zero16());
      score = score + Set16(w[h]) * relu;
    }
    alignas(64) float out[16];
    Store16(out, score);
    std::memcpy(it.out + (b0 - it.p0), out, static_cast<size_t>(n) * sizeof(float));
  }
}

}  // namespace
GB_OPS_KERNELS_END();

#if HWY_ONCE
namespace genbridge::ops::detail {
HWY_EXPORT(ScoreItem);

namespace {

Status validate(const LightningIndexerCall& c, TokenCacheGeometry& g) {
  const char* op = c.op;
  GB_ASSIGN_OR_RETURN(g, check_indexer_cache(op, c.keys));
  GB_RETURN_IF_ERROR(check_float_input(op, "q", c.q));
  if (c.q.rank() != 3 || c.q.dim(2) != g.width || c.q.dim(1) < 1) {
    return invalid_argument(s(op) + ": q has shape " + c.q.shape_string() +
                            " but must be [num_query_tokens, index_n_heads >= 1, index_head_dim = " + n(g.width) + "]");
  }
  const int64_t num_tokens = c.q.dim(0), heads = c.q.dim(1);
  GB_RETURN_IF_ERROR(check_float_input(op, "weights", c.weights));
  if (c.weights.rank() != 2 || c.weights.dim(0) != num_tokens || c.weights.dim(1) != heads) {
    return invalid_argument(s(op) + ": weights has shape " + c.weights.shape_string() + " but must be [" +
                            n(num_tokens) + ", " + n(heads) + "] ([num_query_tokens, index_n_heads])");
  }
  GB_RETURN_IF_ERROR(check_int32(op, "topk_indices", c.topk_indices, 2, "[num_query_tokens, index_topk]"));
  if (c.topk_indices.dim(0) != num_tokens || c.topk_indices.dim(1) < 1) {
    return invalid_argument(s(op) + ": topk_indices has shape " + c.topk_indices.shape_string() + " but must be [" +
                            n(num_tokens) + ", index_topk >= 1]");
  }
  if (c.topk_scores.data() != nullptr) {
    if (c.topk_scores.dtype() != DType::kF32 || c.topk_scores.rank() != 2 ||
        c.topk_scores.dim(0) != num_tokens || c.topk_scores.dim(1) != c.topk_indices.dim(1)) {
      return invalid_argument(s(op) + ": topk_scores has dtype " + s(dtype_name(c.topk_scores.dtype())) +
                              " and shape " + c.topk_scores.shape_string() + " but must be fp32 " +
                              c.topk_indices.shape_string() + " (topk_indices' shape) or absent");
    }
    GB_RETURN_IF_ERROR(check_host_data(op, "topk_scores", c.topk_scores));
  }
  return check_attention_batch(op, c.block_tables, c.context_lens, c.query_start_loc, num_tokens, g.num_blocks,
                               g.block_size);
}

// a ranks before b: higher score, NaN below every number, then the lower position.
inline bool better(float sa, int32_t a, float sb, int32_t b) {
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return a < b;
}

}  // namespace

Status run_lightning_indexer(const LightningIndexerCall& c) {
  TokenCacheGeometry g;
  GB_RETURN_IF_ERROR(validate(c, g));
  indexer::Plan p{&c, g, c.q.dim(1), (g.width + 15) / 16 * 16};
  const int64_t num_seqs = c.block_tables.dim(0), k = c.topk_indices.dim(1);
  // Score rows of every query token, one after the other (reused across calls; grows once).
  thread_local std::vector<float> scores;
  thread_local std::vector<int64_t> row_start, row_pos, row_seq;
  thread_local std::vector<indexer::Item> items;
  const int64_t num_tokens = c.q.dim(0);
  row_start.assign(static_cast<size_t>(num_tokens + 1), 0);
  row_pos.assign(static_cast<size_t>(num_tokens), 0);
  row_seq.assign(static_cast<size_t>(num_tokens), 0);
  for (int64_t q = 0; q < num_seqs; ++q) {
    const int64_t b = at_i32(c.query_start_loc, q), e = at_i32(c.query_start_loc, q + 1);
    const int64_t ctx = at_i32(c.context_lens, q);
    for (int64_t t = b; t < e; ++t) {
      row_pos[t] = ctx - (e - b) + (t - b);
      row_seq[t] = q;
    }
  }
  for (int64_t t = 0; t < num_tokens; ++t) row_start[t + 1] = row_start[t] + row_pos[t] + 1;
  if (scores.size() < static_cast<size_t>(row_start[num_tokens])) scores.resize(static_cast<size_t>(row_start[num_tokens]));
  items.clear();
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t p0 = 0; p0 <= row_pos[t]; p0 += indexer::kChunk) {
      items.push_back({static_cast<int32_t>(t), static_cast<int32_t>(row_seq[t]), p0,
                       std::min<int64_t>(p0 + indexer::kChunk, row_pos[t] + 1), scores.data() + row_start[t] + p0});
    }
  }
  const size_t floats = static_cast<size_t>(p.num_heads * p.dp + p.num_heads + 16 * p.dp + 256 + 16);
  auto scratch = [&]() -> float* {
    thread_local std::vector<float> buf;
    if (buf.size() < floats) buf.resize(floats);
    return buf.data();
  };
  const auto score = GB_DISPATCH(ScoreItem);
  const std::vector<indexer::Item>& work = items;
  const int64_t num_items = static_cast<int64_t>(work.size());
  if (num_threads() <= 1 || num_items <= 1 || row_start[num_tokens] * p.num_heads * p.dp < (int64_t{1} << 18)) {
    float* buf = scratch();
    for (int64_t i = 0; i < num_items; ++i) score(p, work[i], buf);
  } else {
    genbridge::detail::parallel_for_dynamic(num_items, [&](int64_t i) { score(p, work[i], scratch()); });
  }
  // Top-k per query token (a total order: the same selection on any thread). The caller's thread_local
  // buffers are bound to references first: inside the lambda their names would mean the worker's own.
  const int64_t bs = g.block_size;
  const std::vector<float>& all_scores = scores;
  const std::vector<int64_t>& starts = row_start;
  const std::vector<int64_t>& positions = row_pos;
  const std::vector<int64_t>& seqs = row_seq;
  genbridge::detail::parallel_for(num_tokens, std::max<int64_t>(1, starts[num_tokens] / std::max<int64_t>(1, num_tokens)) * 8,
                                  [&](int64_t t0, int64_t t1) {
    thread_local std::vector<int32_t> cand;
    for (int64_t t = t0; t < t1; ++t) {
      const float* sc = all_scores.data() + starts[t];
      const int64_t count = positions[t] + 1;
      cand.resize(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) cand[i] = static_cast<int32_t>(i);
      int64_t sel = count;
      if (count > k) {
        std::nth_element(cand.begin(), cand.begin() + k, cand.end(),
                         [&](int32_t a, int32_t b) { return better(sc[a], a, sc[b], b); });
        sel = k;
        std::sort(cand.begin(), cand.begin() + k);
      }
      int32_t* out = c.topk_indices.data_as<int32_t>();
      float* outs = c.topk_scores.data() ? c.topk_scores.data_as<float>() : nullptr;
      for (int64_t j = 0; j < k; ++j) {
        int32_t v = -1;
        float sv = 0.f;
        if (j < sel) {
          const int64_t pos = cand[j];
          sv = sc[pos];
          v = c.index_format == TopkIndexFormat::kSequencePositions
                  ? static_cast<int32_t>(pos)
                  : static_cast<int32_t>(int64_t{at_i32(c.block_tables, seqs[t], pos / bs)} * bs + pos % bs);
        }
        out[t * c.topk_indices.stride(0) + j * c.topk_indices.stride(1)] = v;
        if (outs) outs[t * c.topk_scores.stride(0) + j * c.topk_scores.stride(1)] = sv;
      }
    }
  });
  return ok_status();
}

}  // namespace genbridge::ops::detail
#endif  // HWY_ONCE
