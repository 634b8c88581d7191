// The roofs themselves (bench/support/bench_util.h) at 1 and 2 threads on the CPU target in use: the FMA
// loop's GFLOP/s (and the bf16 dot instruction's under avx512_bf16), and the cold (DRAM) copy and read-only
// bandwidths at 8 x LLC. Every other benchmark measures the same roofs at its own sizes; this row set is the
// reference for the docs.
#include <benchmark/benchmark.h>

#include "genbridge/core/threading.h"
#include "support/bench_util.h"

namespace genbridge::bench {
namespace {

void BM_roofs(benchmark::State& state) {
  set_num_threads(static_cast<int>(state.range(0)));
  for (auto _ : state) {
    state.counters["fma_GFLOP/s"] = fma_gflops(true);
    if (const double dot = bf16_dot_gflops(true); dot > 0) state.counters["bf16dot_GFLOP/s"] = dot;
    state.counters["copy_GB/s"] = copy_gbps(8 * llc_bytes(), true, true);
    state.counters["read_GB/s"] = read_gbps(8 * llc_bytes(), true, true);
  }
  state.counters["load"] = load_average();
  set_num_threads(0);
}

BENCHMARK(BM_roofs)->Name("roofs")->ArgNames({"threads"})->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace genbridge::bench
