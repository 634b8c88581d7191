// linear/linear: weight bytes read per second against the same-binary copy kernel (run_memory_bound),
// plus GFLOP/s. Bytes per call = N * K * sizeof(w) (the weight, read once; x and y are not counted).
// Batch 1 decode is weight-bandwidth bound; large M is compute bound and its ratio is not a target.
#include <benchmark/benchmark.h>

#include "genbridge/ops/linear/linear.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

void BM_linear(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  OwnedTensor x(DType::kBF16, {M, K}), w(DType::kBF16, {N, K}), y(DType::kBF16, {M, N});
  testing::fill_uniform(x.view(), 1);
  testing::fill_uniform(w.view(), 2, -0.1f, 0.1f);
  const size_t weight_bytes = static_cast<size_t>(N * K) * 2;
  run_memory_bound(state, weight_bytes, [&] {
    const Status st = ops::linear(x.view(), w.view(), y.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(M * N * K) * static_cast<double>(state.iterations()),
                                                 benchmark::Counter::kIsRate);
  state.SetLabel("x bf16, w bf16, y bf16");
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K"});
  for (int64_t nk : {2048, 4096})
    for (int64_t m : {1, 8, 32, 256}) b->Args({m, nk, nk});
  for (int64_t m : {1, 8, 32, 256}) b->Args({m, 6144, 2048});  // e.g. a fused q/k/v or gate/up projection
  b->UseManualTime();
}

BENCHMARK(BM_linear)->Name("linear")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
