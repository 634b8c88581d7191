// norm/* bandwidth against the same-binary copy kernel. Bytes moved per call: x read + y written
// (+ residual read and residual_sum written for add_*) + weight read + rstd written.
#include <benchmark/benchmark.h>

#include "genbridge/ops/norm/add_rms_norm.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

enum Op { kRms, kGemma, kAddRms };

template <Op op>
void BM_norm(benchmark::State& state) {
  const DType d = state.range(0) == 0 ? DType::kBF16 : DType::kF16;
  const int64_t rows = state.range(1), cols = state.range(2);
  OwnedTensor x(d, {rows, cols}), w(d, {cols}), y(d, {rows, cols}), r(d, {rows, cols}), s(d, {rows, cols}),
      rstd(DType::kF32, {rows, 1});
  testing::fill_uniform(x.view(), 1);
  testing::fill_uniform(w.view(), 2, -0.5f, 0.5f);
  testing::fill_uniform(r.view(), 3);
  const size_t elem = dtype_size(d);
  size_t bytes = static_cast<size_t>(rows * cols) * elem * 2 + static_cast<size_t>(cols) * elem;
  if (op == kAddRms) {
    bytes += static_cast<size_t>(rows * cols) * elem * 2;
  } else {
    bytes += static_cast<size_t>(rows) * 4;
  }
  run_memory_bound(state, bytes, [&] {
    Status st;
    if constexpr (op == kRms) st = ops::rms_norm(x.view(), w.view(), 1e-6f, y.view(), rstd.view());
    if constexpr (op == kGemma) st = ops::gemma_rms_norm(x.view(), w.view(), 1e-6f, y.view(), rstd.view());
    if constexpr (op == kAddRms) st = ops::add_rms_norm(x.view(), w.view(), r.view(), 1e-6f, y.view(), s.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(std::string(dtype_name(d)));
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"dtype", "rows", "hidden"});
  for (int64_t dt : {0, 1})
    for (int64_t rows : {1, 16, 64, 256})
      for (int64_t hidden : {2048, 4096, 8192}) b->Args({dt, rows, hidden});
  b->UseManualTime();
}

BENCHMARK(BM_norm<kRms>)->Name("rms_norm")->Apply(shapes);
BENCHMARK(BM_norm<kGemma>)->Name("gemma_rms_norm")->Apply(shapes);
BENCHMARK(BM_norm<kAddRms>)->Name("add_rms_norm")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
