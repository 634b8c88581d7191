// moe/expert_ffn: weight bytes read per second against the same-binary copy kernel (run_memory_bound),
// plus GFLOP/s. Bytes per call = (experts the batch routes to) * 3 * I * H * sizeof(bf16): each routed
// expert's gate, up and down weights, read once. M tokens, top-8 of 16 experts, distinct per token,
// seeded. Batch 1 decode is weight-bandwidth bound; larger M is compute bound.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "genbridge/ops/moe/expert_ffn.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

constexpr int64_t kExperts = 16, kTopK = 8;

void BM_expert_ffn(benchmark::State& state) {
  const int64_t M = state.range(0), H = state.range(1), I = state.range(2);
  OwnedTensor x(DType::kBF16, {M, H}), ids(DType::kI32, {M, kTopK}), out(DType::kBF16, {M, kTopK, H}),
      wg(DType::kBF16, {kExperts, I, H}), wu(DType::kBF16, {kExperts, I, H}), wd(DType::kBF16, {kExperts, H, I});
  testing::fill_uniform(x.view(), 1);
  testing::fill_uniform(wg.view(), 2, -0.05f, 0.05f);
  testing::fill_uniform(wu.view(), 3, -0.05f, 0.05f);
  testing::fill_uniform(wd.view(), 4, -0.05f, 0.05f);
  std::mt19937_64 rng(5);
  std::set<int32_t> active;
  for (int64_t t = 0; t < M; ++t) {
    std::vector<int32_t> all(kExperts);
    for (int32_t e = 0; e < kExperts; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t j = 0; j < kTopK; ++j) {
      ids.view().data_as<int32_t>()[t * kTopK + j] = all[j];
      active.insert(all[j]);
    }
  }
  const size_t weight_bytes = active.size() * static_cast<size_t>(3 * I * H) * 2;
  run_memory_bound(state, weight_bytes, [&] {
    const Status st = ops::expert_ffn(x.view(), ids.view(), wg.view(), wu.view(), wd.view(), 0, kExperts, out.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["experts"] = static_cast<double>(active.size());
  state.counters["GFLOP/s"] = benchmark::Counter(
      6.0 * static_cast<double>(M * kTopK * H * I) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "H", "I"});
  for (auto [h, i] : {std::pair<int64_t, int64_t>{2048, 768}, {1024, 512}, {2048, 512}})
    for (int64_t m : {1, 8, 32, 256}) b->Args({m, h, i});
  b->UseManualTime();
}

BENCHMARK(BM_expert_ffn)->Name("expert_ffn")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
