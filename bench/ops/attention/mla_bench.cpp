// attention/mla_decode, attention/sparse_mla_decode and attention/lightning_indexer against their roofs
// (bench/support/bench_util.h), at DeepSeek-V3.2's dimensions: kv_lora_rank 512, rope 64, 16 query heads
// (128 heads over 8 tensor-parallel ranks), one query token per sequence, pages of 128 tokens handed out
// shuffled, every MLA KV representation the build runs. Bytes per call = the KV bytes read: dense
// batch * context * row bytes (bf16 1152, int8 642, fp8 656); sparse batch * index_topk * row bytes.
// FLOPs = tokens read * heads * (2 (L + R) + 2 L) (scores and the latent accumulation). The cache is
// cold: calls rotate through copies of it. The indexer: 64 heads of 128, one key row per token (bf16 256
// B, fp8 132 B), FLOPs = context * heads * 2 * 128. Rows are written once through the stable writers and
// tiled over the cache (valid codes and scales in every representation).
// attention/sharedkv_sparse_attention at DeepSeek-V4-Flash's dimensions: one shared K = V head of 448 + 64,
// 64 query heads, a 128-token window plus 0 (sliding-window layers) or 512 compressed entries (the
// indexer's top-k of a ratio-4 layer, or the 512 windows of a ratio-128 layer at 64 Ki tokens), per-head
// sinks. Bytes = the rows read (bf16 1024 B, int8 + fp16 + bf16 rope 578 B, mxfp8 640 B); FLOPs = entries *
// heads * (2 * 512 + 2 * 512) (scores and the value accumulation over the whole row).
// attention/kv_compress at V4's three compressors (ratio 4 with overlap at 512 and at the indexer's 128,
// ratio 128 at 512), over bf16 kv and gate rows of a 4096-token prefill or one window (decode). Bytes =
// the kv and gate rows read (bf16) plus the entries written (fp32); FLOPs = 36 lane operations per slot and
// channel, counted in the kernel: the score (gate + ape, twice), the max, the exp's range reduction,
// degree-7 polynomial and 2^n (29), the sum and the fused multiply-add (2). The exp makes it compute-bound.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/ops/attention/kv_compress.h"
#include "genbridge/ops/attention/lightning_indexer.h"
#include "genbridge/ops/attention/mla_decode.h"
#include "genbridge/ops/attention/sharedkv_sparse_attention.h"
#include "genbridge/ops/attention/sparse_mla_decode.h"
#include "genbridge/ops/kv_cache/bf16_indexer_key_write.h"
#include "genbridge/ops/kv_cache/bf16_mla_kv_write.h"
#include "genbridge/ops/kv_cache/fp8_indexer_key_write.h"
#include "genbridge/ops/kv_cache/fp8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/int8_mla_kv_write.h"
#include "genbridge/ops/kv_cache/mxfp8_mla_kv_write.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using ops::IndexerKeyFormat;
using ops::MlaKvFormat;
using testing::OwnedTensor;

constexpr int64_t kL = 512, kR = 64, kHeads = 16, kPage = 128, kIndexHeads = 64, kIndexDim = 128;
constexpr int64_t kPattern = 256;  // distinct token rows, tiled over the cache

bool fp8() { return ops::build_target() != "Ascend910"; }

// An MLA cache of `tokens` slots: kPattern rows written through the format's writer, then tiled.
struct MlaStore {
  std::vector<std::byte> kv, scale, rope;
  ops::MlaKvCache cache;
  explicit MlaStore(MlaKvFormat f, int64_t tokens, int64_t L = kL) {
    const ops::KvRowBytes rb = ops::mla_kv_row_bytes(f, L, kR);
    kv.resize(static_cast<size_t>(tokens * rb.main));
    scale.resize(static_cast<size_t>(tokens * rb.scale) + 2);
    rope.resize(static_cast<size_t>(tokens * rb.rope) + 2);
    const int64_t pages = tokens / kPage;
    const DType dt = f == MlaKvFormat::kBf16 ? DType::kBF16 : f == MlaKvFormat::kInt8Fp16ScaleSplitRope ? DType::kI8
                                                                                                       : DType::kU8;
    cache.format = f;
    cache.kv_lora_rank = L;
    cache.rope_dim = kR;
    cache.kv_cache = TensorView(kv.data(), dt, {pages, kPage, rb.main / static_cast<int64_t>(dtype_size(dt))});
    cache.scale_cache = TensorView(scale.data(), DType::kF16, {pages, kPage});
    cache.rope_cache = TensorView(rope.data(), DType::kBF16, {pages, kPage, kR});
    OwnedTensor lat(DType::kF32, {kPattern, L}), r(DType::kF32, {kPattern, kR});
    testing::fill_uniform(lat.view(), 1);
    testing::fill_uniform(r.view(), 2);
    std::vector<int32_t> flat(kPattern), pairs(2 * kPattern);
    for (int32_t i = 0; i < kPattern; ++i) {
      flat[i] = i;
      pairs[2 * i] = i / kPage;
      pairs[2 * i + 1] = i % kPage;
    }
    const TensorView fl(flat.data(), DType::kI32, {kPattern}), pr(pairs.data(), DType::kI32, {kPattern, 2});
    Status st = f == MlaKvFormat::kBf16 ? ops::bf16_mla_kv_write(lat.view(), r.view(), fl, cache)
                : f == MlaKvFormat::kInt8Fp16ScaleSplitRope ? ops::int8_mla_kv_write(lat.view(), r.view(), pr, cache)
                : f == MlaKvFormat::kMxfp8RopeFirstPacked   ? ops::mxfp8_mla_kv_write(lat.view(), r.view(), fl, cache)
                                                            : ops::fp8_mla_kv_write(lat.view(), r.view(), fl, cache);
    GB_CHECK(st.ok(), "mla bench: writer failed");
    auto tile = [&](std::vector<std::byte>& b, int64_t row) {
      if (row == 0) return;
      for (int64_t t = kPattern; t < tokens; t += kPattern) {
        std::memcpy(b.data() + t * row, b.data(), static_cast<size_t>(std::min(kPattern, tokens - t) * row));
      }
    };
    tile(kv, rb.main);
    tile(scale, rb.scale);
    tile(rope, rb.rope);
  }
};

// Block tables of `copies` x `batch` sequences of `ctx` tokens over shuffled pages.
std::vector<std::vector<int32_t>> shuffled_tables(int copies, int64_t pages) {
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(copies));
  std::mt19937_64 rng(7);
  for (int c = 0; c < copies; ++c) {
    for (int64_t i = 0; i < pages; ++i) tables[c].push_back(static_cast<int32_t>(c * pages + i));
    std::shuffle(tables[c].begin(), tables[c].end(), rng);
  }
  return tables;
}

// range: format, batch, ctx, index_topk (0 = dense mla_decode).
void BM_mla(benchmark::State& state) {
  const auto f = static_cast<MlaKvFormat>(state.range(0));
  const int64_t batch = state.range(1), ctx = state.range(2), topk = state.range(3);
  const int64_t row = ops::mla_kv_row_bytes(f, kL, kR).total();
  const int64_t read_tokens = batch * (topk > 0 ? std::min(topk, ctx) : ctx);
  const size_t kv_bytes = static_cast<size_t>(batch * ctx * row);
  const int copies = cold_copies(kv_bytes);
  const int64_t pages_per_seq = (ctx + kPage - 1) / kPage, pages = batch * pages_per_seq;
  MlaStore store(f, pages * copies * kPage);
  const auto tables = shuffled_tables(copies, pages);
  std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(ctx)), loc(static_cast<size_t>(batch + 1));
  for (int64_t s = 0; s <= batch; ++s) loc[s] = static_cast<int32_t>(s);
  OwnedTensor ql(DType::kBF16, {batch, kHeads, kL}), qr(DType::kBF16, {batch, kHeads, kR}),
      out(DType::kBF16, {batch, kHeads, kL});
  testing::fill_uniform(ql.view(), 3);
  testing::fill_uniform(qr.view(), 4);
  // index_topk positions per query: a random sorted subset of the context (what the indexer hands over).
  std::vector<int32_t> idx;
  if (topk > 0) {
    std::mt19937_64 rng(9);
    std::vector<int32_t> all(static_cast<size_t>(ctx));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t p = 0; p < ctx; ++p) all[p] = static_cast<int32_t>(p);
      std::shuffle(all.begin(), all.end(), rng);
      std::vector<int32_t> sel(all.begin(), all.begin() + std::min(topk, ctx));
      std::sort(sel.begin(), sel.end());
      sel.resize(static_cast<size_t>(topk), -1);
      idx.insert(idx.end(), sel.begin(), sel.end());
    }
  }
  const TensorView cl(lens.data(), DType::kI32, {batch}), qsl(loc.data(), DType::kI32, {batch + 1});
  const Work work{.bytes = static_cast<double>(read_tokens * row),
                  .flops = static_cast<double>(read_tokens * kHeads) * (2.0 * (kL + kR) + 2.0 * kL),
                  .cold = true,
                  .read_roof = true};
  run_roofline(state, work, [&](int64_t i) {
    const TensorView bt(const_cast<int32_t*>(tables[static_cast<size_t>(i) % tables.size()].data()), DType::kI32,
                        {batch, pages_per_seq});
    const Status st = topk > 0 ? ops::sparse_mla_decode(ql.view(), qr.view(), store.cache,
                                                        TensorView(idx.data(), DType::kI32, {batch, topk}),
                                                        ops::TopkIndexFormat::kSequencePositions, bt, cl, qsl, 0.04f,
                                                        out.view())
                               : ops::mla_decode(ql.view(), qr.view(), store.cache, bt, cl, qsl, 0.04f, out.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["kv_copies"] = copies;
  state.SetLabel(std::string(ops::mla_kv_format_name(f)));
}

void mla_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kv", "batch", "ctx", "topk"});
  std::vector<int64_t> formats = {0, 1};
  if (fp8()) formats.push_back(2);
  for (int64_t f : formats) {
    for (auto [batch, ctx] : {std::pair<int64_t, int64_t>{1, 4096}, {1, 16384}, {8, 4096}}) b->Args({f, batch, ctx, 0});
    for (int64_t ctx : {16384, 65536}) b->Args({f, 1, ctx, 2048});
  }
  b->UseManualTime();
}

// range: key format, ctx, index_topk.
void BM_lightning_indexer(benchmark::State& state) {
  const auto f = static_cast<IndexerKeyFormat>(state.range(0));
  const int64_t ctx = state.range(1), topk = state.range(2);
  const int64_t row = ops::indexer_key_row_bytes(f, kIndexDim).main;
  const size_t bytes = static_cast<size_t>(ctx * row);
  const int copies = cold_copies(bytes);
  const int64_t pages = (ctx + kPage - 1) / kPage, tokens = pages * copies * kPage;
  std::vector<std::byte> keys(static_cast<size_t>(tokens * row));
  const DType dt = f == IndexerKeyFormat::kBf16 ? DType::kBF16 : DType::kU8;
  const ops::IndexerKeyCache cache{
      f, kIndexDim, TensorView(keys.data(), dt, {pages * copies, kPage, row / static_cast<int64_t>(dtype_size(dt))})};
  {
    OwnedTensor k(DType::kF32, {kPattern, kIndexDim});
    testing::fill_uniform(k.view(), 5);
    std::vector<int32_t> flat(kPattern);
    for (int32_t i = 0; i < kPattern; ++i) flat[i] = i;
    const TensorView fl(flat.data(), DType::kI32, {kPattern});
    const Status st = f == IndexerKeyFormat::kBf16 ? ops::bf16_indexer_key_write(k.view(), fl, cache)
                                                   : ops::fp8_indexer_key_write(k.view(), fl, cache);
    GB_CHECK(st.ok(), "indexer bench: writer failed");
    for (int64_t t = kPattern; t < tokens; t += kPattern) {
      std::memcpy(keys.data() + t * row, keys.data(), static_cast<size_t>(std::min(kPattern, tokens - t) * row));
    }
  }
  const auto tables = shuffled_tables(copies, pages);
  std::vector<int32_t> lens = {static_cast<int32_t>(ctx)}, loc = {0, 1}, idx(static_cast<size_t>(topk));
  OwnedTensor q(DType::kBF16, {1, kIndexHeads, kIndexDim}), w(DType::kF32, {1, kIndexHeads});
  testing::fill_uniform(q.view(), 6);
  testing::fill_uniform(w.view(), 7, 0.f, 0.1f);
  const Work work{.bytes = static_cast<double>(bytes),
                  .flops = static_cast<double>(ctx * kIndexHeads) * 2.0 * kIndexDim,
                  .cold = true,
                  .read_roof = true};
  run_roofline(state, work, [&](int64_t i) {
    const TensorView bt(const_cast<int32_t*>(tables[static_cast<size_t>(i) % tables.size()].data()), DType::kI32,
                        {1, pages});
    const Status st = ops::lightning_indexer(q.view(), w.view(), cache, bt, TensorView(lens.data(), DType::kI32, {1}),
                                             TensorView(loc.data(), DType::kI32, {2}),
                                             ops::TopkIndexFormat::kSequencePositions,
                                             TensorView(idx.data(), DType::kI32, {1, topk}), TensorView());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(std::string(ops::indexer_key_format_name(f)));
}

void indexer_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"keys", "ctx", "topk"});
  std::vector<int64_t> formats = {0};
  if (fp8()) formats.push_back(1);
  for (int64_t f : formats) {
    for (int64_t ctx : {16384, 65536}) b->Args({f, ctx, 2048});
  }
  b->UseManualTime();
}

constexpr int64_t kV4Latent = 448, kV4Heads = 64, kV4Window = 128;

// range: format, batch, compressed entries per query. Window and compressed rows share one cache (the
// window's rows a contiguous run per sequence, the compressed rows scattered), rotated over cold copies.
void BM_sharedkv(benchmark::State& state) {
  const auto f = static_cast<MlaKvFormat>(state.range(0));
  const int64_t batch = state.range(1), C = state.range(2), W = kV4Window, D = kV4Latent + kR;
  const int64_t row = ops::mla_kv_row_bytes(f, kV4Latent, kR).total();
  const int64_t per_copy = batch * (W + 4 * C);  // the rows the compressed entries are drawn from, too
  const int copies = cold_copies(static_cast<size_t>(batch * (W + C) * row));
  const int64_t pages = (per_copy * copies + kPage - 1) / kPage;
  MlaStore store(f, pages * kPage, kV4Latent);
  std::mt19937_64 rng(11);
  std::vector<std::vector<int32_t>> windows(static_cast<size_t>(copies)), compressed(static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    const int64_t base = c * per_copy;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < W; ++j) windows[c].push_back(static_cast<int32_t>(base + b * W + j));
      for (int64_t j = 0; j < C; ++j) {
        compressed[c].push_back(static_cast<int32_t>(base + batch * W + static_cast<int64_t>(rng() % (4 * C * batch))));
      }
    }
    if (C == 0) compressed[c].push_back(0);
  }
  OwnedTensor q(DType::kBF16, {batch, kV4Heads, D}), out(DType::kBF16, {batch, kV4Heads, D}),
      sinks(DType::kF32, {kV4Heads});
  testing::fill_uniform(q.view(), 12);
  testing::fill_uniform(sinks.view(), 13);
  auto* qd = static_cast<bf16_t*>(q.data());
  const TensorView qn = TensorView::strided(qd, DType::kBF16, {batch, kV4Heads, kV4Latent}, {kV4Heads * D, D, 1});
  const TensorView qr = TensorView::strided(qd + kV4Latent, DType::kBF16, {batch, kV4Heads, kR}, {kV4Heads * D, D, 1});
  const Work work{.bytes = static_cast<double>(batch * (W + C) * row),
                  .flops = static_cast<double>(batch * (W + C) * kV4Heads) * 4.0 * static_cast<double>(D),
                  .cold = true,
                  .read_roof = true};
  run_roofline(state, work, [&](int64_t i) {
    const size_t c = static_cast<size_t>(i) % windows.size();
    const Status st = ops::sharedkv_sparse_attention(
        qn, qr, store.cache, TensorView(windows[c].data(), DType::kI32, {batch, W}), store.cache,
        TensorView(compressed[c].data(), DType::kI32, {batch, C}), sinks.view(), 0.044f, out.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["kv_copies"] = copies;
  state.SetLabel(std::string(ops::mla_kv_format_name(f)));
}

void sharedkv_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kv", "batch", "compressed"});
  std::vector<int64_t> formats = {0, 1};
  if (fp8()) formats.push_back(3);
  for (int64_t f : formats) {
    for (int64_t batch : {1, 8}) {
      for (int64_t c : {0, 512}) b->Args({f, batch, c});
    }
  }
  b->UseManualTime();
}

// range: ratio, D, overlap, tokens.
void BM_kv_compress(benchmark::State& state) {
  const int64_t ratio = state.range(0), D = state.range(1), tokens = state.range(3);
  const bool overlap = state.range(2) != 0;
  const int64_t coff = overlap ? 2 : 1, rows = tokens + (overlap ? ratio : 0), windows = tokens / ratio;
  const int copies = cold_copies(static_cast<size_t>(2 * rows * coff * D * 2));
  std::vector<OwnedTensor> kv, gate;
  for (int c = 0; c < copies; ++c) {
    kv.emplace_back(DType::kBF16, std::vector<int64_t>{rows, coff * D});
    gate.emplace_back(DType::kBF16, std::vector<int64_t>{rows, coff * D});
    testing::fill_uniform(kv.back().view(), 20 + c);
    testing::fill_uniform(gate.back().view(), 40 + c);
  }
  OwnedTensor ape(DType::kF32, {ratio, coff * D}), out(DType::kF32, {windows, D});
  testing::fill_uniform(ape.view(), 14);
  const int64_t slots = (overlap ? 2 : 1) * ratio;
  const Work work{.bytes = static_cast<double>(2 * rows * coff * D * 2 + windows * D * 4),
                  .flops = static_cast<double>(windows * slots * D) * 36.0,
                  .cold = true,
                  .read_roof = true};
  run_roofline(state, work, [&](int64_t i) {
    const size_t c = static_cast<size_t>(i) % kv.size();
    const Status st = ops::kv_compress(kv[c].view(), gate[c].view(), ape.view(), ratio, overlap, true, out.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["kv_copies"] = copies;
}

void kv_compress_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ratio", "D", "overlap", "tokens"});
  for (int64_t tokens : {4096}) {
    b->Args({4, 512, 1, tokens});
    b->Args({4, 128, 1, tokens});
    b->Args({128, 512, 0, tokens});
  }
  b->Args({4, 512, 1, 4});
  b->Args({128, 512, 0, 128});
  b->UseManualTime();
}

BENCHMARK(BM_mla)->Name("mla_decode")->Apply(mla_shapes);
BENCHMARK(BM_kv_compress)->Name("kv_compress")->Apply(kv_compress_shapes);
BENCHMARK(BM_sharedkv)->Name("sharedkv_sparse_attention")->Apply(sharedkv_shapes);
BENCHMARK(BM_lightning_indexer)->Name("lightning_indexer")->Apply(indexer_shapes);

}  // namespace
}  // namespace genbridge::bench
