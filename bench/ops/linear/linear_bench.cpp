// linear/linear, bf16 x [M, K] times bf16 w [N, K]^T -> bf16 y [M, N], against its roofs
// (bench/support/bench_util.h): bytes = w + x + y, FLOPs = 2 M N K. The weights are always cold: the
// benchmark rotates through enough copies of w that none is in the last-level cache when it is used again
// (a model's layers each have their own weights), and the memory roof is the cold copy.
// M = 1 (GEMV) is weight-bandwidth bound: its figure is mem_frac (target >= 0.8 of copy).
// M >= 64 (GEMM) is compute bound: its figure is fma_frac (target >= 0.6 of the FMA roof).
// packed:1 rows read the weights packed once before the timing (ops/linear/packed_weights.h); packed:0 rows the
// checkpoint layout: the ratio of the two in one run is what packing gains.
#include <benchmark/benchmark.h>

#include <vector>

#include "genbridge/ops/linear/linear.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

void BM_linear(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const bool packed = state.range(3) != 0;
  OwnedTensor x(DType::kBF16, {M, K}), w0(DType::kBF16, {N, K}), y(DType::kBF16, {M, N});
  testing::fill_uniform(x.view(), 1);
  testing::fill_uniform(w0.view(), 2, -0.1f, 0.1f);
  const size_t weight_bytes = static_cast<size_t>(N * K) * 2;
  std::vector<OwnedTensor> w(static_cast<size_t>(cold_copies(weight_bytes)), w0);
  // packed:1: each copy packed once before the timing (ops/linear/packed_weights.h, as the engine does at load).
  std::vector<ops::PackedWeights> pw;
  for (size_t i = 0; packed && i < w.size(); ++i) {
    auto p = ops::PackedWeights::pack(w[i].view());
    if (!p.ok()) return state.SkipWithError(p.status().to_string().c_str());
    pw.push_back(std::move(*p));
  }
  const Work work{.bytes = static_cast<double>(weight_bytes + static_cast<size_t>(M * K + M * N) * 2),
                  .flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K),
                  .cold = true,
                  .read_roof = M == 1,
                  .bf16_dot = true};
  run_roofline(state, work, [&](int64_t i) {
    const size_t c = static_cast<size_t>(i) % w.size();
    const Status st = ops::linear(x.view(), w[c].view(), y.view(), nullptr, packed ? &pw[c] : nullptr);
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["w_copies"] = static_cast<double>(w.size());
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "packed"});
  // 2048 x 2048; 4096 x 4096; a fused q/k/v or gate/up projection; the `small` preset's q_proj and LM head.
  for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {4096, 4096}, {6144, 2048}, {2048, 1024}, {8192, 1024}})
    for (int64_t m : {1, 8, 32, 64, 128, 256, 512})
      for (int64_t packed : {0, 1}) b->Args({m, n, k, packed});
  b->UseManualTime();
}

BENCHMARK(BM_linear)->Name("linear")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
