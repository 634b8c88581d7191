#pragma once
// Benchmark helpers: every memory-bound benchmark reports its bandwidth next to a streaming copy
// kernel's bandwidth for the same number of bytes, measured in the same binary and run.

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>

namespace genbridge::bench {

// GB/s of a multi-threaded copy (same thread count as the kernels) that moves `bytes_moved` bytes
// (half read, half written); best of several repetitions, cached per size.
double copy_gbps(size_t bytes_moved);

// Runs `fn` once per benchmark iteration with manual timing and sets the counters
//   GB/s       bytes_moved per iteration / time
//   copy_GB/s  the copy kernel at the same bytes_moved
//   ratio      GB/s / copy_GB/s
// The benchmark must be registered with ->UseManualTime().
template <typename Fn>
void run_memory_bound(benchmark::State& state, size_t bytes_moved, Fn&& fn) {
  fn();  // warm caches and page in outputs
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    total += dt;
  }
  const double gbps = static_cast<double>(bytes_moved) * static_cast<double>(state.iterations()) / total / 1e9;
  const double copy = copy_gbps(bytes_moved);
  state.counters["GB/s"] = gbps;
  state.counters["copy_GB/s"] = copy;
  state.counters["ratio"] = gbps / copy;
}

}  // namespace genbridge::bench
