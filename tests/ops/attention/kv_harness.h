#pragma once
// Shared harness for the kv_cache/* and attention/paged_decode contract tests: an owned paged cache in
// each representation, written through the stable writers, read back exactly through the scalar codecs,
// plus batch builders and the quantized-KV error bound. Runs unchanged in every target build.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/core/formats.h"
#include "genbridge/core/threading.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "genbridge/ops/kv_cache/bf16_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_kv_write.h"
#include "genbridge/ops/kv_cache/int8_kv_write.h"
#include "ops/common/attention/attention_ref.h"
#include "support/tensor_util.h"

namespace genbridge::testing {

using ops::KvCacheFormat;

inline bool fp8_supported() { return ops::build_target() != "Ascend910"; }

inline std::string format_label(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kBf16: return "bf16";
    case KvCacheFormat::kInt8Fp16Scale: return "int8";
    case KvCacheFormat::kFp8Fp32PackedScale: return "fp8";
  }
  return "?";
}

inline std::vector<KvCacheFormat> all_formats() {
  return {KvCacheFormat::kBf16, KvCacheFormat::kInt8Fp16Scale, KvCacheFormat::kFp8Fp32PackedScale};
}

// A paged K/V cache (and scale caches) owned by the test, in the layout of KvCacheFormat.
class TestCache {
 public:
  TestCache(KvCacheFormat f, int64_t num_blocks, int64_t kv_heads, int64_t block_size, int64_t head_dim)
      : format_(f), blocks_(num_blocks), heads_(kv_heads), bs_(block_size), d_(head_dim) {
    const int64_t row = f == KvCacheFormat::kFp8Fp32PackedScale ? d_ + 4 : d_;
    const DType dt = element_dtype();
    k_ = std::make_unique<OwnedTensor>(dt, std::vector<int64_t>{blocks_, heads_, bs_, row});
    v_ = std::make_unique<OwnedTensor>(dt, std::vector<int64_t>{blocks_, heads_, bs_, row});
    ks_ = std::make_unique<OwnedTensor>(DType::kF16, std::vector<int64_t>{blocks_, heads_, bs_});
    vs_ = std::make_unique<OwnedTensor>(DType::kF16, std::vector<int64_t>{blocks_, heads_, bs_});
  }
  DType element_dtype() const {
    return format_ == KvCacheFormat::kBf16            ? DType::kBF16
           : format_ == KvCacheFormat::kInt8Fp16Scale ? DType::kI8
                                                      : DType::kU8;
  }
  KvCacheFormat format() const { return format_; }
  int64_t num_blocks() const { return blocks_; }
  int64_t block_size() const { return bs_; }
  int64_t head_dim() const { return d_; }
  int64_t kv_heads() const { return heads_; }

  ops::PagedKvCache view() {
    ops::PagedKvCache c;
    c.format = format_;
    c.key_cache = k_->view();
    c.value_cache = v_->view();
    if (format_ == KvCacheFormat::kInt8Fp16Scale) {
      c.key_scale_cache = ks_->view();
      c.value_scale_cache = vs_->view();
    }
    return c;
  }
  OwnedTensor& key() { return *k_; }
  OwnedTensor& value() { return *v_; }
  OwnedTensor& key_scales() { return *ks_; }
  OwnedTensor& value_scales() { return *vs_; }
  std::vector<std::byte> all_bytes() const {
    std::vector<std::byte> b = k_->bytes();
    for (const auto* t : {v_.get(), ks_.get(), vs_.get()}) b.insert(b.end(), t->bytes().begin(), t->bytes().end());
    return b;
  }

  // Writes K/V rows for the given flat slots through this representation's writer, passing the slot
  // mapping in the shape that writer takes (bf16: flat, or pairs when `pairs` is set).
  Status write(const TensorView& key, const TensorView& value, const std::vector<int32_t>& slots, bool pairs = false) {
    const int64_t n = static_cast<int64_t>(slots.size());
    flat_ = slots;
    pair_.assign(2 * slots.size(), 0);
    for (size_t i = 0; i < slots.size(); ++i) {
      pair_[2 * i] = static_cast<int32_t>(slots[i] / bs_);
      pair_[2 * i + 1] = static_cast<int32_t>(slots[i] % bs_);
    }
    const TensorView flat_view(flat_.data(), DType::kI32, {n});
    const TensorView pair_view(pair_.data(), DType::kI32, {n, 2});
    const ops::PagedKvCache c = view();
    switch (format_) {
      case KvCacheFormat::kBf16:
        return ops::bf16_kv_write(key, value, pairs ? pair_view : flat_view, c.key_cache, c.value_cache);
      case KvCacheFormat::kInt8Fp16Scale:
        return ops::int8_kv_write(key, value, pair_view, c.key_cache, c.value_cache, c.key_scale_cache,
                                  c.value_scale_cache);
      case KvCacheFormat::kFp8Fp32PackedScale:
        return ops::fp8_kv_write(key, value, flat_view, c.key_cache, c.value_cache);
    }
    return internal_error("unreachable");
  }

  // Exact stored value of element c of the (slot, kv head) row, decoded with the scalar codecs.
  double stored(bool is_key, int64_t slot, int64_t h, int64_t c) const { return stored_code(is_key, slot, h, c) * stored_scale(is_key, slot, h); }
  double stored_code(bool is_key, int64_t slot, int64_t h, int64_t c) const {
    const int64_t r = row_index(slot, h);
    const OwnedTensor& t = is_key ? *k_ : *v_;
    switch (format_) {
      case KvCacheFormat::kBf16: {
        bf16_t b;
        std::memcpy(&b, t.bytes().data() + (r * d_ + c) * 2, 2);
        return bf16_to_float(b);
      }
      case KvCacheFormat::kInt8Fp16Scale: return static_cast<int8_t>(t.bytes()[r * d_ + c]);
      case KvCacheFormat::kFp8Fp32PackedScale:
        return fp8_e4m3fn_to_float(fp8_e4m3fn_t{static_cast<uint8_t>(t.bytes()[r * (d_ + 4) + c])});
    }
    return 0;
  }
  double stored_scale(bool is_key, int64_t slot, int64_t h) const {
    const int64_t r = row_index(slot, h);
    switch (format_) {
      case KvCacheFormat::kBf16: return 1.0;
      case KvCacheFormat::kInt8Fp16Scale: {
        fp16_t s;
        std::memcpy(&s, (is_key ? *ks_ : *vs_).bytes().data() + r * 2, 2);
        return fp16_to_float(s);
      }
      case KvCacheFormat::kFp8Fp32PackedScale: {
        float s;
        std::memcpy(&s, (is_key ? *k_ : *v_).bytes().data() + r * (d_ + 4) + d_, 4);
        return s;
      }
    }
    return 0;
  }
  int64_t row_index(int64_t slot, int64_t h) const { return ((slot / bs_) * heads_ + h) * bs_ + slot % bs_; }

 private:
  KvCacheFormat format_;
  int64_t blocks_, heads_, bs_, d_;
  std::unique_ptr<OwnedTensor> k_, v_, ks_, vs_;
  std::vector<int32_t> flat_, pair_;
};

// One attention problem: sequences with context lengths and query counts, block tables over a shuffled
// set of pages, K/V rows (fp32, exact originals) per sequence, and query rows.
struct Problem {
  int64_t num_heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  std::vector<int32_t> ctx, q_len;
  int64_t max_blocks = 0;
  std::vector<int32_t> block_tables, context_lens, query_start_loc;
  std::vector<std::vector<float>> k, v;  // per sequence [ctx][kv_heads][head_dim]
  std::unique_ptr<OwnedTensor> query;    // [num_query_tokens, num_heads, head_dim]
  int64_t num_blocks = 0;
  int64_t num_query_tokens = 0;
  std::vector<int32_t> slots_of(size_t s) const {
    std::vector<int32_t> out(static_cast<size_t>(ctx[s]));
    for (int32_t j = 0; j < ctx[s]; ++j) {
      out[j] = block_tables[s * max_blocks + j / block_size] * static_cast<int32_t>(block_size) + j % block_size;
    }
    return out;
  }
};

// K rows ~ U[-1, 1]; V rows = a per-(sequence, head) mean in U[-1, 1] plus U[-0.5, 0.5] noise (so the
// attention output has a norm comparable to the rows'); queries ~ U[-1, 1] in `qdtype`.
inline Problem make_problem(int64_t num_heads, int64_t kv_heads, int64_t head_dim, int64_t block_size,
                            std::vector<int32_t> ctx, std::vector<int32_t> q_len, uint64_t seed,
                            DType qdtype = DType::kBF16, int64_t spare_blocks = 3) {
  Problem p;
  p.num_heads = num_heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.block_size = block_size;
  p.ctx = std::move(ctx);
  p.q_len = std::move(q_len);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const size_t n = p.ctx.size();
  for (int32_t c : p.ctx) p.max_blocks = std::max<int64_t>(p.max_blocks, (c + block_size - 1) / block_size);
  p.max_blocks = std::max<int64_t>(p.max_blocks, 1) + 1;  // one spare column: tables need not be tight
  int64_t used = 0;
  for (int32_t c : p.ctx) used += (c + block_size - 1) / block_size;
  p.num_blocks = used + spare_blocks;
  std::vector<int32_t> pages(static_cast<size_t>(p.num_blocks));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  p.block_tables.assign(n * p.max_blocks, -1);  // unused entries are invalid on purpose
  size_t next = 0;
  for (size_t s = 0; s < n; ++s) {
    const int64_t nb = (p.ctx[s] + block_size - 1) / block_size;
    for (int64_t b = 0; b < nb; ++b) p.block_tables[s * p.max_blocks + b] = pages[next++];
  }
  p.context_lens = p.ctx;
  p.query_start_loc.assign(n + 1, 0);
  for (size_t s = 0; s < n; ++s) p.query_start_loc[s + 1] = p.query_start_loc[s] + p.q_len[s];
  p.num_query_tokens = p.query_start_loc[n];
  p.k.resize(n);
  p.v.resize(n);
  for (size_t s = 0; s < n; ++s) {
    const size_t rows = static_cast<size_t>(p.ctx[s] * kv_heads);
    p.k[s].resize(rows * head_dim);
    p.v[s].resize(rows * head_dim);
    std::vector<float> mean(static_cast<size_t>(kv_heads * head_dim));
    for (float& m : mean) m = u(rng);
    for (float& x : p.k[s]) x = u(rng);
    for (size_t i = 0; i < p.v[s].size(); ++i) p.v[s][i] = mean[i % mean.size()] + 0.5f * u(rng);
  }
  p.query = std::make_unique<OwnedTensor>(qdtype, std::vector<int64_t>{p.num_query_tokens, num_heads, head_dim});
  fill_uniform(p.query->view(), seed + 7, -1.f, 1.f);
  return p;
}

// Writes every sequence's K/V into `cache` (one writer call per sequence, in order).
inline Status write_problem(TestCache& cache, Problem& p) {
  for (size_t s = 0; s < p.ctx.size(); ++s) {
    const int64_t c = p.ctx[s];
    const TensorView k(p.k[s].data(), DType::kF32, {c, p.kv_heads, p.head_dim});
    const TensorView v(p.v[s].data(), DType::kF32, {c, p.kv_heads, p.head_dim});
    GB_RETURN_IF_ERROR(cache.write(k, v, p.slots_of(s)));
  }
  return ok_status();
}

struct Views {
  TensorView block_tables, context_lens, query_start_loc;
};
inline Views views(Problem& p) {
  const int64_t n = static_cast<int64_t>(p.ctx.size());
  return {TensorView(p.block_tables.data(), DType::kI32, {n, p.max_blocks}),
          TensorView(p.context_lens.data(), DType::kI32, {n}),
          TensorView(p.query_start_loc.data(), DType::kI32, {n + 1})};
}

inline Status run_attention(TestCache& cache, Problem& p, const TensorView& out, float scale) {
  const Views vw = views(p);
  return ops::paged_decode(p.query->view(), cache.view(), vw.block_tables, vw.context_lens, vw.query_start_loc, scale,
                           out);
}

// fp64 reference output rows of sequence s, from the original K/V (`stored` = false) or from the values
// the cache actually holds (`stored` = true).
inline std::vector<double> reference(const TestCache& cache, const Problem& p, size_t s, double scale, bool stored) {
  const int64_t c = p.ctx[s], kh = p.kv_heads, d = p.head_dim;
  std::vector<double> k(static_cast<size_t>(c * kh * d)), v(k.size());
  const std::vector<int32_t> slots = p.slots_of(s);
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t h = 0; h < kh; ++h) {
      for (int64_t e = 0; e < d; ++e) {
        const size_t i = static_cast<size_t>((j * kh + h) * d + e);
        k[i] = stored ? cache.stored(true, slots[j], h, e) : p.k[s][i];
        v[i] = stored ? cache.stored(false, slots[j], h, e) : p.v[s][i];
      }
    }
  }
  const int64_t q0 = p.query_start_loc[s];
  std::vector<double> q(static_cast<size_t>(p.q_len[s] * p.num_heads * d));
  const std::vector<double> all_q = to_doubles(p.query->view());
  std::copy(all_q.begin() + q0 * p.num_heads * d, all_q.begin() + (q0 + p.q_len[s]) * p.num_heads * d, q.begin());
  std::vector<double> out;
  ref::attention(q, p.q_len[s], p.num_heads, k, v, c, kh, d, scale, out);
  return out;
}

// Per-element bound on |x - dequantized(x)| for the representation, derived from the format
// (docs/design.md#deviceoperator-contract scale rules): int8 rounds x / s to an integer (error <= s/2; |x / s| <= 127 *
// (1 + 2^-11) never clamps by more than rounding); fp8 e4m3fn keeps 3 mantissa bits (relative error <= 2^-4 for
// normals) and has a subnormal quantum of 2^-9 (absolute error <= s * 2^-10). The 1e-6 covers the fp32 division x / s;
// bf16 rounds with relative error <= 2^-9.
inline double element_bound(KvCacheFormat f, double x, double s) {
  switch (f) {
    case KvCacheFormat::kBf16: return std::fabs(x) * 0x1p-9;
    case KvCacheFormat::kInt8Fp16Scale: return 0.5 * s * (1 + 1e-6);
    case KvCacheFormat::kFp8Fp32PackedScale: return (std::fabs(x) * 0x1p-4 + s * 0x1p-10) * (1 + 1e-6);
  }
  return 0;
}

}  // namespace genbridge::testing
