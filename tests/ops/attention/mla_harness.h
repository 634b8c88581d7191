#pragma once
// Shared harness for the MLA / DSA contract tests (kv_cache/*_mla_kv_write, *_indexer_key_write,
// attention/mla_decode, sparse_mla_decode, lightning_indexer): owned caches in every representation the
// build's target has, written through the stable writers, with the fp64 reference's view of every stored
// row, and paged batches with shuffled block tables. Runs unchanged in every target build.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/ops/attention/lightning_indexer.h"
#include "genbridge/ops/attention/mla_decode.h"
#include "genbridge/ops/attention/sharedkv_sparse_attention.h"
#include "genbridge/ops/attention/sparse_mla_decode.h"
#include "genbridge/ops/kv_cache/bf16_indexer_key_write.h"
#include "genbridge/ops/kv_cache/bf16_mla_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/int8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/kv_format.h"
#include "genbridge/ops/kv_cache/mxfp8_mla_kv_write.h"
#include "ops/common/attention/attention_ref.h"
#include "ops/common/attention/mla_ref.h"
#include "support/tensor_util.h"

namespace genbridge::testing {

using ops::IndexerKeyFormat;
using ops::MlaKvFormat;
using ops::TopkIndexFormat;

inline bool mla_fp8_supported() { return ops::build_target() != "Ascend910"; }

inline std::vector<MlaKvFormat> mla_formats() {
  std::vector<MlaKvFormat> f = {MlaKvFormat::kBf16, MlaKvFormat::kInt8Fp16ScaleSplitRope};
  if (mla_fp8_supported()) {
    f.push_back(MlaKvFormat::kFp8TileScalePacked);
    f.push_back(MlaKvFormat::kMxfp8RopeFirstPacked);
  }
  return f;
}
inline std::vector<IndexerKeyFormat> indexer_formats() {
  std::vector<IndexerKeyFormat> f = {IndexerKeyFormat::kBf16};
  if (mla_fp8_supported()) f.push_back(IndexerKeyFormat::kFp8HadamardPackedScale);
  return f;
}
inline std::string label(MlaKvFormat f) { return std::string(ops::mla_kv_format_name(f)); }
inline std::string label(IndexerKeyFormat f) { return std::string(ops::indexer_key_format_name(f)); }

inline double bf16_round(double v) { return ref::round_to_minifloat(static_cast<float>(v), 7, -126); }

// The slot mapping a representation's writer takes: flat, or [block, offset] pairs (int8).
inline std::vector<int32_t> slot_mapping_for(bool pairs, const std::vector<int64_t>& slots, int64_t bs) {
  std::vector<int32_t> m;
  for (int64_t s : slots) {
    if (pairs) {
      m.push_back(static_cast<int32_t>(s / bs));
      m.push_back(static_cast<int32_t>(s % bs));
    } else {
      m.push_back(static_cast<int32_t>(s));
    }
  }
  return m;
}

// An MLA cache owned by the test, with the reference's fp64 view of every written slot.
class MlaCache {
 public:
  MlaCache(MlaKvFormat f, int64_t num_blocks, int64_t bs, int64_t L, int64_t R)
      : f_(f), blocks_(num_blocks), bs_(bs), L_(L), R_(R) {
    const ops::KvRowBytes rb = ops::mla_kv_row_bytes(f, L, R);
    const DType dt = f == MlaKvFormat::kBf16 ? DType::kBF16 : f == MlaKvFormat::kInt8Fp16ScaleSplitRope ? DType::kI8
                                                                                                        : DType::kU8;
    kv_ = std::make_unique<OwnedTensor>(dt, std::vector<int64_t>{blocks_, bs_, rb.main / (int64_t)dtype_size(dt)});
    scale_ = std::make_unique<OwnedTensor>(DType::kF16, std::vector<int64_t>{blocks_, bs_});
    rope_ = std::make_unique<OwnedTensor>(DType::kBF16, std::vector<int64_t>{blocks_, bs_, R_});
    ref_latent_.assign(static_cast<size_t>(blocks_ * bs_ * L_), 0.0);
    ref_rope_.assign(static_cast<size_t>(blocks_ * bs_ * R_), 0.0);
  }
  ops::MlaKvCache cache() const {
    ops::MlaKvCache c;
    c.format = f_;
    c.kv_lora_rank = L_;
    c.rope_dim = R_;
    c.kv_cache = kv_->view();
    if (f_ == MlaKvFormat::kInt8Fp16ScaleSplitRope) {
      c.scale_cache = scale_->view();
      c.rope_cache = rope_->view();
    }
    return c;
  }
  int64_t block_size() const { return bs_; }
  int64_t num_blocks() const { return blocks_; }
  std::vector<std::byte> all_bytes() const {
    std::vector<std::byte> b = kv_->bytes();
    b.insert(b.end(), scale_->bytes().begin(), scale_->bytes().end());
    b.insert(b.end(), rope_->bytes().begin(), rope_->bytes().end());
    return b;
  }
  // Writes latent [n][L] and rope [n][R] (fp32) to `slots` with the representation's writer; records the
  // reference's view of each stored row.
  Status write(const std::vector<float>& latent, const std::vector<float>& rope, const std::vector<int64_t>& slots) {
    const int64_t n = static_cast<int64_t>(slots.size());
    std::vector<float> l = latent, r = rope;
    const TensorView lv(l.data(), DType::kF32, {n, L_}), rv(r.data(), DType::kF32, {n, R_});
    const bool pairs = f_ == MlaKvFormat::kInt8Fp16ScaleSplitRope;
    std::vector<int32_t> m = slot_mapping_for(pairs, slots, bs_);
    const TensorView sm = pairs ? TensorView(m.data(), DType::kI32, {n, 2}) : TensorView(m.data(), DType::kI32, {n});
    Status st;
    switch (f_) {
      case MlaKvFormat::kBf16: st = ops::bf16_mla_kv_write(lv, rv, sm, cache()); break;
      case MlaKvFormat::kInt8Fp16ScaleSplitRope: st = ops::int8_mla_kv_write(lv, rv, sm, cache()); break;
      case MlaKvFormat::kFp8TileScalePacked: st = ops::fp8_mla_kv_write(lv, rv, sm, cache()); break;
      case MlaKvFormat::kMxfp8RopeFirstPacked: st = ops::mxfp8_mla_kv_write(lv, rv, sm, cache()); break;
    }
    if (!st.ok()) return st;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> x(latent.begin() + t * L_, latent.begin() + (t + 1) * L_), deq;
      if (f_ == MlaKvFormat::kBf16) {
        for (double& v : x) v = bf16_round(v);
        deq = x;
      } else if (f_ == MlaKvFormat::kInt8Fp16ScaleSplitRope) {
        double scale;
        ref::int8_kv_row(x, scale, deq);
      } else if (f_ == MlaKvFormat::kFp8TileScalePacked) {
        std::vector<double> scales;
        ref::fp8_mla_latent_row(x, scales, deq);
      } else {
        std::vector<int> bytes;
        ref::mxfp8_mla_latent_row(x, bytes, deq);
      }
      std::copy(deq.begin(), deq.end(), ref_latent_.begin() + slots[t] * L_);
      for (int64_t i = 0; i < R_; ++i) ref_rope_[slots[t] * R_ + i] = bf16_round(rope[t * R_ + i]);
    }
    return st;
  }
  const double* ref_latent(int64_t slot) const { return ref_latent_.data() + slot * L_; }
  const double* ref_rope(int64_t slot) const { return ref_rope_.data() + slot * R_; }

 private:
  MlaKvFormat f_;
  int64_t blocks_, bs_, L_, R_;
  std::unique_ptr<OwnedTensor> kv_, scale_, rope_;
  std::vector<double> ref_latent_, ref_rope_;
};

// Sequences in a paged cache: shuffled blocks, each sequence's tokens at its block table's slots.
struct PagedBatch {
  std::vector<int64_t> ctx, q_len;
  int64_t max_blocks = 0;
  std::vector<int32_t> tables, ctx32, qsl;
  PagedBatch(std::vector<int64_t> context, std::vector<int64_t> queries, int64_t bs, int64_t num_blocks,
             uint32_t seed)
      : ctx(std::move(context)), q_len(std::move(queries)) {
    for (int64_t c : ctx) max_blocks = std::max(max_blocks, (c + bs - 1) / bs);
    std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), std::mt19937(seed));
    size_t next = 0;
    tables.assign(static_cast<size_t>(ctx.size() * max_blocks), -1);
    for (size_t s = 0; s < ctx.size(); ++s) {
      for (int64_t b = 0; b < (ctx[s] + bs - 1) / bs; ++b) tables[s * max_blocks + b] = blocks.at(next++);
      ctx32.push_back(static_cast<int32_t>(ctx[s]));
    }
    qsl.push_back(0);
    for (int64_t q : q_len) qsl.push_back(qsl.back() + static_cast<int32_t>(q));
    bs_ = bs;
  }
  int64_t num_seqs() const { return static_cast<int64_t>(ctx.size()); }
  int64_t num_tokens() const { return qsl.back(); }
  int64_t slot(int64_t s, int64_t pos) const { return int64_t{tables[s * max_blocks + pos / bs_]} * bs_ + pos % bs_; }
  TensorView block_tables() { return TensorView(tables.data(), DType::kI32, {num_seqs(), max_blocks}); }
  TensorView context_lens() { return TensorView(ctx32.data(), DType::kI32, {num_seqs()}); }
  TensorView query_start_loc() { return TensorView(qsl.data(), DType::kI32, {num_seqs() + 1}); }
  // (sequence, position) of query token t.
  std::pair<int64_t, int64_t> query(int64_t t) const {
    for (int64_t s = 0; s < num_seqs(); ++s) {
      if (t < qsl[s + 1]) return {s, ctx[s] - q_len[s] + (t - qsl[s])};
    }
    return {-1, -1};
  }
  int64_t bs_ = 0;
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// Fills every sequence of `batch` in `cache` with random latent / rope rows (seeded).
inline void fill_mla(MlaCache& cache, const PagedBatch& batch, int64_t L, int64_t R, uint32_t seed) {
  for (int64_t s = 0; s < batch.num_seqs(); ++s) {
    std::vector<int64_t> slots;
    for (int64_t p = 0; p < batch.ctx[s]; ++p) slots.push_back(batch.slot(s, p));
    const auto lat = random_floats(slots.size() * L, seed + 17 * s, -2.f, 2.f);
    const auto rope = random_floats(slots.size() * R, seed + 17 * s + 5, -2.f, 2.f);
    ASSERT_TRUE(cache.write(lat, rope, slots).ok());
  }
}

// An indexer key cache owned by the test, with the reference's fp64 keys (for fp8: the dequantized
// rotated key rotated back, so reference scores use the unrotated query).
class IndexerCache {
 public:
  IndexerCache(IndexerKeyFormat f, int64_t num_blocks, int64_t bs, int64_t D) : f_(f), blocks_(num_blocks), bs_(bs), D_(D) {
    const int64_t row = ops::indexer_key_row_bytes(f, D).main;
    keys_ = f == IndexerKeyFormat::kBf16
                ? std::make_unique<OwnedTensor>(DType::kBF16, std::vector<int64_t>{blocks_, bs_, D_})
                : std::make_unique<OwnedTensor>(DType::kU8, std::vector<int64_t>{blocks_, bs_, row});
    ref_.assign(static_cast<size_t>(blocks_ * bs_ * D_), 0.0);
  }
  ops::IndexerKeyCache cache() const {
    ops::IndexerKeyCache c;
    c.format = f_;
    c.head_dim = D_;
    c.key_cache = keys_->view();
    return c;
  }
  Status write(const std::vector<float>& keys, const std::vector<int64_t>& slots) {
    const int64_t n = static_cast<int64_t>(slots.size());
    std::vector<float> k = keys;
    std::vector<int32_t> m = slot_mapping_for(false, slots, bs_);
    const TensorView kv(k.data(), DType::kF32, {n, D_}), sm(m.data(), DType::kI32, {n});
    Status st = f_ == IndexerKeyFormat::kBf16 ? ops::bf16_indexer_key_write(kv, sm, cache())
                                              : ops::fp8_indexer_key_write(kv, sm, cache());
    if (!st.ok()) return st;
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> x(keys.begin() + t * D_, keys.begin() + (t + 1) * D_);
      if (f_ == IndexerKeyFormat::kBf16) {
        for (double& v : x) v = bf16_round(v);
      } else {
        // The stored codes and scale read back through the scalar codec, rotated back in fp64 (H is its
        // own inverse), so reference scores use the unrotated query.
        const uint8_t* row = static_cast<const uint8_t*>(keys_->data()) + slots[t] * (D_ + 4);
        float scale;
        std::memcpy(&scale, row + D_, sizeof scale);
        for (int64_t i = 0; i < D_; ++i) x[i] = fp8_e4m3fn_to_float(fp8_e4m3fn_t{row[i]}) * double{scale};
        x = ref::hadamard(x);
      }
      std::copy(x.begin(), x.end(), ref_.begin() + slots[t] * D_);
    }
    return st;
  }
  const double* ref_key(int64_t slot) const { return ref_.data() + slot * D_; }
  std::vector<std::byte> bytes() const { return keys_->bytes(); }

 private:
  IndexerKeyFormat f_;
  int64_t blocks_, bs_, D_;
  std::unique_ptr<OwnedTensor> keys_;
  std::vector<double> ref_;
};

}  // namespace genbridge::testing
