#pragma once
// Roofline harness for the benchmarks. Every row reports what it achieved next to its roofs, both measured
// in the same binary and process:
//   memory roof   copy_GB/s  a multi-threaded memcpy moving the same number of bytes (half read, half
//                            written). Warm (one buffer pair, re-copied) when the kernel's working set fits
//                            in the last-level cache and the kernel is not rotated; cold (pairs rotated so
//                            the total exceeds 4 x LLC and nothing is cached) otherwise.
//                 read_GB/s  (optional) a read-only streaming kernel over the same bytes, same residency.
//   compute roof  fma_GFLOP/s  a register-only multiply-add loop (Highway, dispatched like the kernels, so
//                            GENBRIDGE_CPU_TARGET=avx2 measures the AVX2 roof) on num_threads() threads.
// Figures of merit: mem_frac = GB/s / copy_GB/s, fma_frac = GFLOP/s / fma_GFLOP/s, and
// roof_frac = max of the two = (roofline time bound) / (measured time) = the ratio to min(roofs).
// Kernel and roofs are each the best (shortest) of their repetitions: on a shared machine the best run
// is the one least disturbed by neighbours, for the kernel and for the roofs alike.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace genbridge::bench {

// Size of the last-level cache in bytes (as Google Benchmark reads it; 32 MiB when unknown).
size_t llc_bytes();
// "model name" of /proc/cpuinfo ("unknown" elsewhere).
std::string cpu_model_name();
// The 1-minute load average (/proc/loadavg), -1 when unavailable.
double load_average();

// How many copies of a working set of `bytes` a benchmark rotates through so that none is in the LLC
// when it is used again: ceil(4 * LLC / bytes), at least 1, at most 64.
int cold_copies(size_t bytes);

// Whether a benchmark whose calls touch `bytes` should rotate copies of its buffers and compare with the
// cold copy: when the working set is at least half the LLC (it would be partly cached otherwise, and a
// model's layers each have their own weights and activations at those sizes).
inline bool is_cold(size_t bytes) { return bytes >= llc_bytes() / 2; }

// Memory roofs (GB/s) at `bytes` (copy: bytes moved, half read and half written; read: bytes read),
// warm or cold as above, on num_threads() threads; best of several repetitions, cached per
// (bytes, cold, threads). `refresh` measures again and keeps the best of all measurements so far: on a
// shared machine a roof measured in a bad moment would flatter every kernel compared with it. Cold roofs of more than 8
// x LLC are measured at 8 x LLC (the bandwidth no longer depends on the size there).
double copy_gbps(size_t bytes, bool cold, bool refresh = false);
double read_gbps(size_t bytes, bool cold, bool refresh = false);
// Compute roof: GFLOP/s of a register-only fp32 multiply-add loop (2 FLOPs per lane) on the CPU target in
// use, on num_threads() threads; cached per (target, threads). On targets without FMA instructions
// (sse4, scalar) it is a separate multiply and add.
double fma_gflops(bool refresh = false);
// Compute roof of the bf16 dot-product instruction (AVX512_BF16 vdpbf16ps: 16 lanes x 2 products, 4 FLOPs per lane):
// GFLOP/s of a register-only loop of it on num_threads() threads; 0 where the kernels do not use it
// (simd::bf16_dot_enabled() false: another CPU target, or a CPU without it).
double bf16_dot_gflops(bool refresh = false);

// The work of one call of the benchmarked function.
struct Work {
  double bytes = 0;        // bytes moved (the memory roof's unit); 0: no memory roof
  double flops = 0;        // floating-point operations; 0: no compute roof
  bool cold = false;       // the benchmark rotates its buffers (compare with the cold copy)
  bool read_roof = false;  // also report read_GB/s (read-dominated kernels)
  bool bf16_dot = false;   // the flops may run on the bf16 dot instruction (bf16 inputs and weights): under the
                           // avx512_bf16 target, its roof is the compute roof (bf16dot_GFLOP/s, dot_frac)
};

// Sets the roofline counters for a call of `work` that took `seconds` (measuring the roofs again, best so far):
//   GB/s copy_GB/s [read_GB/s] mem_frac   when work.bytes > 0
//   GFLOP/s fma_GFLOP/s fma_frac          when work.flops > 0
//   bf16dot_GFLOP/s dot_frac              when work.bf16_dot and the kernels use the bf16 dot instruction
//                                         (roof_frac then takes dot_frac, not fma_frac)
//   roof_frac, load (1-minute load average after the row)
void set_roofline_counters(benchmark::State& state, const Work& work, double seconds);

// Runs `fn` once per benchmark iteration with manual timing and sets the roofline counters from the best
// iteration. `fn` takes the iteration number (to rotate through cold copies). The benchmark must be
// registered with ->UseManualTime().
template <typename Fn>
void run_roofline(benchmark::State& state, const Work& work, Fn&& fn) {
  int64_t i = 0;
  fn(i++);  // page in outputs, fault in code
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(i++);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    state.SetIterationTime(dt);
    best = std::min(best, dt);
  }
  set_roofline_counters(state, work, best);
}

}  // namespace genbridge::bench
