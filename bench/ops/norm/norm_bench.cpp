// norm/* against the memory roof (bench/support/bench_util.h: figure mem_frac, target >= 0.8 of copy).
// Bytes per call: x read + y written (+ residual read and residual_sum written for add_*) + weight read
// + rstd written. Working sets of at least half the LLC rotate through copies of their tensors (cold) and
// compare with the cold copy; smaller ones stay cached and compare with the warm copy of the same size.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "genbridge/ops/norm/add_rms_norm.h"
#include "genbridge/ops/norm/gemma_rms_norm.h"
#include "genbridge/ops/norm/rms_norm.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

enum Op { kRms, kGemma, kAddRms };

struct Io {
  OwnedTensor x, y, r, s, rstd;
};

template <Op op>
void BM_norm(benchmark::State& state) {
  const DType d = state.range(0) == 0 ? DType::kBF16 : DType::kF16;
  const int64_t rows = state.range(1), cols = state.range(2);
  OwnedTensor w(d, {cols});
  testing::fill_uniform(w.view(), 2, -0.5f, 0.5f);
  Io first{OwnedTensor(d, {rows, cols}), OwnedTensor(d, {rows, cols}), OwnedTensor(d, {rows, cols}),
           OwnedTensor(d, {rows, cols}), OwnedTensor(DType::kF32, {rows, 1})};
  testing::fill_uniform(first.x.view(), 1);
  testing::fill_uniform(first.r.view(), 3);
  const size_t elem = dtype_size(d);
  size_t bytes = static_cast<size_t>(rows * cols) * elem * 2 + static_cast<size_t>(cols) * elem;
  if (op == kAddRms) {
    bytes += static_cast<size_t>(rows * cols) * elem * 2;
  } else {
    bytes += static_cast<size_t>(rows) * 4;
  }
  const bool cold = is_cold(bytes);
  std::vector<Io> io(static_cast<size_t>(cold ? cold_copies(bytes) : 1), first);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = cold}, [&](int64_t i) {
    Io& b = io[static_cast<size_t>(i) % io.size()];
    Status st;
    if constexpr (op == kRms) st = ops::rms_norm(b.x.view(), w.view(), 1e-6f, b.y.view(), b.rstd.view());
    if constexpr (op == kGemma) st = ops::gemma_rms_norm(b.x.view(), w.view(), 1e-6f, b.y.view(), b.rstd.view());
    if constexpr (op == kAddRms)
      st = ops::add_rms_norm(b.x.view(), w.view(), b.r.view(), 1e-6f, b.y.view(), b.s.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(std::string(dtype_name(d)) + (cold ? " cold" : " warm"));
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"dtype", "rows", "hidden"});
  for (int64_t dt : {0, 1})
    for (int64_t rows : {1, 64, 1024, 8192})
      for (int64_t hidden : {2048, 4096}) b->Args({dt, rows, hidden});
  b->UseManualTime();
}

BENCHMARK(BM_norm<kRms>)->Name("rms_norm")->Apply(shapes);
BENCHMARK(BM_norm<kGemma>)->Name("gemma_rms_norm")->Apply(shapes);
BENCHMARK(BM_norm<kAddRms>)->Name("add_rms_norm")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
