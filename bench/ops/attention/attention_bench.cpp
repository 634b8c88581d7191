// attention/paged_decode against its roofs (bench/support/bench_util.h): 8 KV heads, head_dim 128, 32
// query heads (GQA 4), one query token per sequence, every KV representation the build runs, pages of 128
// tokens handed out shuffled. Bytes per call = the KV cache bytes read: batch * context * 8 heads * (K + V)
// * bytes per (token, kv head) (bf16 256, int8 128 + 2, fp8 132); FLOPs = batch * context * 8 heads *
// 4 * 4 * 128 (scores and V accumulation, 4 query heads per kv head). The cache is always cold: calls
// rotate through copies of it (each layer of a model has its own), compared with the cold copy. Figure:
// mem_frac (target >= 0.7 of copy at context >= 4k). GENBRIDGE_BENCH_SWEEP=1 registers a larger grid.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "genbridge/build_info.h"
#include "genbridge/core/formats.h"
#include "genbridge/ops/attention/paged_decode.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using ops::KvCacheFormat;
using testing::OwnedTensor;

constexpr int64_t kKvHeads = 8, kHeads = 32, kHeadDim = 128, kPage = 128;

int64_t row_bytes(KvCacheFormat f) {
  return f == KvCacheFormat::kBf16 ? 2 * kHeadDim : (f == KvCacheFormat::kInt8Fp16Scale ? kHeadDim : kHeadDim + 4);
}
int64_t side_bytes(KvCacheFormat f) { return f == KvCacheFormat::kInt8Fp16Scale ? 2 : 0; }

// Random but valid cache contents for the format (values about N(0,1)-sized), filled directly: going
// through the writers would dominate set-up time at large sizes.
void fill_cache(KvCacheFormat f, std::byte* rows, std::byte* side, int64_t num_rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<std::byte> pattern(1 << 16);
  for (size_t i = 0; i < pattern.size(); i += 2) {
    uint16_t bits = 0;
    if (f == KvCacheFormat::kBf16) {
      bits = float_to_bf16(u(rng)).bits;
    } else if (f == KvCacheFormat::kInt8Fp16Scale) {
      bits = static_cast<uint16_t>(static_cast<uint8_t>(float_to_int8(u(rng) * 60.f)) |
                                   (static_cast<uint8_t>(float_to_int8(u(rng) * 60.f)) << 8));
    } else {
      bits = static_cast<uint16_t>(float_to_fp8_e4m3fn(u(rng) * 200.f).bits |
                                   (float_to_fp8_e4m3fn(u(rng) * 200.f).bits << 8));
    }
    std::memcpy(pattern.data() + i, &bits, 2);
  }
  const int64_t rb = row_bytes(f);
  const int64_t total = num_rows * rb;
  for (int64_t off = 0; off < total; off += static_cast<int64_t>(pattern.size())) {
    std::memcpy(rows + off, pattern.data(), static_cast<size_t>(std::min<int64_t>(pattern.size(), total - off)));
  }
  if (f == KvCacheFormat::kFp8Fp32PackedScale) {
    const float scale = 2.f / 448.f;
    for (int64_t r = 0; r < num_rows; ++r) std::memcpy(rows + r * rb + kHeadDim, &scale, 4);
  }
  if (f == KvCacheFormat::kInt8Fp16Scale) {
    const fp16_t scale = float_to_fp16(2.f / 127.f);
    for (int64_t r = 0; r < num_rows; ++r) std::memcpy(side + 2 * r, &scale, 2);
  }
}

void BM_paged_decode(benchmark::State& state) {
  const auto f = static_cast<KvCacheFormat>(state.range(0));
  const int64_t batch = state.range(1), ctx = state.range(2);
  const int64_t rb = row_bytes(f), sb = side_bytes(f);
  const size_t kv_bytes = static_cast<size_t>(batch * ctx * kKvHeads * 2 * (rb + sb));
  const int copies = cold_copies(kv_bytes);
  const int64_t pages_per_seq = (ctx + kPage - 1) / kPage, pages = batch * pages_per_seq, all_pages = pages * copies;
  const int64_t rows = all_pages * kKvHeads * kPage;
  std::vector<std::byte> k(static_cast<size_t>(rows * rb)), v(k.size()), ks(static_cast<size_t>(rows * sb) + 2),
      vs(ks.size());
  fill_cache(f, k.data(), ks.data(), rows, 1);
  fill_cache(f, v.data(), vs.data(), rows, 2);
  const DType edt =
      f == KvCacheFormat::kBf16 ? DType::kBF16 : (f == KvCacheFormat::kInt8Fp16Scale ? DType::kI8 : DType::kU8);
  const int64_t elems = f == KvCacheFormat::kBf16 ? kHeadDim : rb;
  ops::PagedKvCache cache;
  cache.format = f;
  cache.key_cache = TensorView(k.data(), edt, {all_pages, kKvHeads, kPage, elems});
  cache.value_cache = TensorView(v.data(), edt, {all_pages, kKvHeads, kPage, elems});
  if (f == KvCacheFormat::kInt8Fp16Scale) {
    cache.key_scale_cache = TensorView(ks.data(), DType::kF16, {all_pages, kKvHeads, kPage});
    cache.value_scale_cache = TensorView(vs.data(), DType::kF16, {all_pages, kKvHeads, kPage});
  }
  // Copy c owns pages [c * pages, (c + 1) * pages), handed out shuffled as a pool that has run for a while would.
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(copies));
  std::mt19937_64 rng(7);
  for (int c = 0; c < copies; ++c) {
    for (int64_t i = 0; i < pages; ++i) tables[c].push_back(static_cast<int32_t>(c * pages + i));
    std::shuffle(tables[c].begin(), tables[c].end(), rng);
  }
  std::vector<int32_t> lens(static_cast<size_t>(batch), static_cast<int32_t>(ctx)), loc(static_cast<size_t>(batch + 1));
  for (int64_t s = 0; s <= batch; ++s) loc[s] = static_cast<int32_t>(s);
  OwnedTensor q(DType::kBF16, {batch, kHeads, kHeadDim}), out(DType::kBF16, {batch, kHeads, kHeadDim});
  testing::fill_uniform(q.view(), 3);
  const TensorView cl(lens.data(), DType::kI32, {batch}), ql(loc.data(), DType::kI32, {batch + 1});
  const Work work{.bytes = static_cast<double>(kv_bytes),
                  .flops = static_cast<double>(batch * ctx * kKvHeads) * 4.0 * (kHeads / kKvHeads) * kHeadDim,
                  .cold = true,
                  .read_roof = true};
  run_roofline(state, work, [&](int64_t i) {
    const TensorView bt(tables[static_cast<size_t>(i) % tables.size()].data(), DType::kI32, {batch, pages_per_seq});
    const Status st = ops::paged_decode(q.view(), cache, bt, cl, ql, 0.088f, out.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["kv_copies"] = copies;
  state.SetLabel(std::string(ops::kv_cache_format_name(f)));
}

bool sweep() {
  const char* e = std::getenv("GENBRIDGE_BENCH_SWEEP");
  return e != nullptr && std::strcmp(e, "0") != 0;
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kv", "batch", "ctx"});
  std::vector<int64_t> formats = {0, 1};
  if (ops::build_target() != "Ascend910") formats.push_back(2);  // Ascend910 has no FP8 data path
  std::vector<std::pair<int64_t, int64_t>> grid;
  if (sweep()) {
    // batch x context up to 256k cached tokens (1 GiB of bf16 KV).
    for (int64_t batch : {1, 8, 64}) {
      for (int64_t ctx : {1024, 4096, 32768}) {
        if (batch * ctx <= 262144) grid.emplace_back(batch, ctx);
      }
    }
    grid.emplace_back(16, 16384);
  } else {
    grid = {{1, 1024}, {1, 4096}, {1, 16384}, {8, 4096}};
  }
  for (int64_t f : formats) {
    for (auto [batch, ctx] : grid) b->Args({f, batch, ctx});
  }
  b->UseManualTime();
}

BENCHMARK(BM_paged_decode)->Name("paged_decode")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
