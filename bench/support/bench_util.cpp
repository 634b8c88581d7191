#include "support/bench_util.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/cpu_target.h"

#define HWY_TARGET_INCLUDE "bench/support/bench_util.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace genbridge::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// 12 independent multiply-add chains (FMA latency 4 x 2 pipes needs 8 in flight), all in registers (12 + 2
// of AVX2's 16). Returns a value depending on every chain so nothing is optimised away; m and c come from
// the caller at run time so the compiler cannot fold the chains (it does on sse4 with constants).
constexpr int kChains = 12;
float FmaLoop(int64_t iters, float mul, float add) {
  const hn::ScalableTag<float> d;
  const auto m = hn::Set(d, mul), c = hn::Set(d, add);
  auto a0 = hn::Set(d, 1.00f), a1 = hn::Set(d, 1.01f), a2 = hn::Set(d, 1.02f), a3 = hn::Set(d, 1.03f);
  auto a4 = hn::Set(d, 1.04f), a5 = hn::Set(d, 1.05f), a6 = hn::Set(d, 1.06f), a7 = hn::Set(d, 1.07f);
  auto a8 = hn::Set(d, 1.08f), a9 = hn::Set(d, 1.09f), a10 = hn::Set(d, 1.10f), a11 = hn::Set(d, 1.11f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  const auto s = hn::Add(hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7))),
                         hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  return hn::GetLane(hn::SumOfLanes(d, s));
}
// FLOPs of one iteration of FmaLoop: a multiply-add (2 FLOPs) per lane per chain.
double FmaFlopsPerIter() { return 2.0 * kChains * static_cast<double>(hn::Lanes(hn::ScalableTag<float>())); }

// Reads [p, p + bytes) once with four independent integer accumulators; returns their sum.
uint32_t ReadStream(const uint8_t* p, size_t bytes) {
  const hn::ScalableTag<uint32_t> d;
  const size_t n = bytes / 4, step = 4 * hn::Lanes(d);
  const uint32_t* u = reinterpret_cast<const uint32_t*>(p);
  auto s0 = hn::Zero(d), s1 = hn::Zero(d), s2 = hn::Zero(d), s3 = hn::Zero(d);
  size_t i = 0;
  for (; i + step <= n; i += step) {
    s0 = hn::Add(s0, hn::LoadU(d, u + i));
    s1 = hn::Add(s1, hn::LoadU(d, u + i + hn::Lanes(d)));
    s2 = hn::Add(s2, hn::LoadU(d, u + i + 2 * hn::Lanes(d)));
    s3 = hn::Add(s3, hn::LoadU(d, u + i + 3 * hn::Lanes(d)));
  }
  uint32_t tail = 0;
  for (; i < n; ++i) tail += u[i];
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)))) + tail;
}

}  // namespace genbridge::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::bench {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(FmaFlopsPerIter);
HWY_EXPORT(ReadStream);

namespace {

double seconds_of(auto&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Buffers of `copies` x `bytes`, page-aligned, written once (so the pages exist).
struct Buffers {
  std::vector<std::unique_ptr<uint8_t[]>> bufs;
  Buffers(int copies, size_t bytes, uint8_t fill) {
    for (int i = 0; i < copies; ++i) {
      bufs.emplace_back(new uint8_t[std::max<size_t>(bytes, 64)]);
      std::memset(bufs.back().get(), fill + i, std::max<size_t>(bytes, 64));
    }
  }
};

// Splits [0, bytes) into 64 KiB chunks over num_threads() threads.
template <typename Fn>
void parallel_bytes(size_t bytes, Fn&& fn) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
  genbridge::detail::parallel_for(
      chunks, kChunk,
      [&](int64_t b, int64_t e) {
        const size_t lo = static_cast<size_t>(b * kChunk), hi = std::min(bytes, static_cast<size_t>(e * kChunk));
        fn(lo, hi);
      },
      1 << 16);
}

// Best time of `op(copy index)` over enough repetitions: at least 7 and 3 rounds of the copies, and about
// 0.2 s of work when calls are short.
template <typename Op>
double best_seconds(int copies, Op&& op) {
  op(0);
  double best = 1e30, spent = 0;
  for (int r = 0; r < 10000 && (r < 7 || r < 3 * copies || spent < 0.2); ++r) {
    const double t = seconds_of([&] { op((r + 1) % copies); });  // op(0) just ran: start at 1
    best = std::min(best, t);
    spent += t;
  }
  return best;
}

using Key = std::tuple<size_t, bool, int>;
std::mutex g_mu;

}  // namespace

size_t llc_bytes() {
  // Google Benchmark's reading of /sys/devices/system/cpu (sysconf's figure is wrong on some VMs).
  size_t best = 0;
  int level = 0;
  for (const auto& c : benchmark::CPUInfo::Get().caches) {
    if (c.type != "Instruction" && c.level >= level) {
      level = c.level;
      best = static_cast<size_t>(c.size);
    }
  }
  return best > 0 ? best : size_t{32} << 20;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double l = -1;
  in >> l;
  return in ? l : -1;
}

int cold_copies(size_t bytes) {
  const size_t want = 4 * llc_bytes();
  return static_cast<int>(std::clamp<size_t>((want + bytes - 1) / std::max<size_t>(bytes, 1), 1, 64));
}

// Cold bandwidth does not depend on the size once the LLC is out of play: larger requests are measured at
// 8 x LLC (an engine step's gigabyte of weights need not be copied to know the DRAM bandwidth).
static size_t measured_size(size_t bytes, bool cold) { return cold ? std::min(bytes, 8 * llc_bytes()) : bytes; }

double copy_gbps(size_t bytes, bool cold, bool refresh) {
  bytes = measured_size(bytes, cold);
  std::lock_guard<std::mutex> lock(g_mu);
  static std::map<Key, double> cache;
  const Key key{bytes, cold, num_threads()};
  if (auto it = cache.find(key); it != cache.end() && !refresh) return it->second;
  const size_t half = std::max<size_t>(64, bytes / 2);
  const int copies = cold ? cold_copies(2 * half) : 1;
  Buffers src(copies, half, 1), dst(copies, half, 0);
  const double t = best_seconds(copies, [&](int c) {
    uint8_t* d = dst.bufs[c].get();
    const uint8_t* s = src.bufs[c].get();
    parallel_bytes(half, [&](size_t lo, size_t hi) { std::memcpy(d + lo, s + lo, hi - lo); });
    benchmark::DoNotOptimize(d);
  });
  double& best = cache[key];
  return best = std::max(best, static_cast<double>(2 * half) / t / 1e9);
}

double read_gbps(size_t bytes, bool cold, bool refresh) {
  bytes = measured_size(bytes, cold);
  std::lock_guard<std::mutex> lock(g_mu);
  static std::map<Key, double> cache;
  const Key key{bytes, cold, num_threads()};
  if (auto it = cache.find(key); it != cache.end() && !refresh) return it->second;
  const size_t n = std::max<size_t>(64, bytes);
  const int copies = cold ? cold_copies(n) : 1;
  Buffers src(copies, n, 1);
  const double t = best_seconds(copies, [&](int c) {
    const uint8_t* s = src.bufs[c].get();
    std::atomic<uint32_t> sink{0};
    parallel_bytes(n, [&](size_t lo, size_t hi) { sink += GB_DISPATCH(ReadStream)(s + lo, hi - lo); });
    benchmark::DoNotOptimize(sink.load());
  });
  double& best = cache[key];
  return best = std::max(best, static_cast<double>(n) / t / 1e9);
}

// GFLOP/s of `threads` threads each running call() (flops_per_call FLOPs, returning a value to keep), the best of 40
// runs: short runs (about 1 ms) and many of them, so that on a shared machine the best run is one where every
// thread had its core for the whole run.
double best_loop_gflops(int threads, double flops_per_call, auto&& call) {
  auto run = [&] {
    // One item per thread; the cost makes parallel_for use all of them.
    genbridge::detail::parallel_for(
        threads, int64_t{1} << 30,
        [&](int64_t b, int64_t e) {
          float sink = 0;
          for (int64_t i = b; i < e; ++i) sink += call();
          benchmark::DoNotOptimize(sink);
        },
        1);
  };
  double best = 1e30;
  for (int r = 0; r < 40; ++r) best = std::min(best, seconds_of(run));
  return flops_per_call * threads / best / 1e9;
}

double fma_gflops(bool refresh) {
  std::lock_guard<std::mutex> lock(g_mu);
  static std::map<std::pair<std::string, int>, double> cache;
  const int threads = num_threads();
  const auto key = std::make_pair(cpu_target(), threads);
  if (auto it = cache.find(key); it != cache.end() && !refresh) return it->second;
  const auto fma = GB_DISPATCH(FmaLoop);
  const double flops_per_iter = GB_DISPATCH(FmaFlopsPerIter)();
  constexpr int64_t kIters = 250'000;
  volatile float mul = 0.999f, add = 0.001f;
  const double gflops = best_loop_gflops(threads, flops_per_iter * static_cast<double>(kIters),
                                         [&] { return fma(kIters, mul, add); });
  double& roof = cache[key];
  return roof = std::max(roof, gflops);
}

double bf16_dot_gflops(bool refresh) {
#if defined(__x86_64__) && defined(__GNUC__)
  simd::ensure_cpu_target();
  if (!simd::bf16_dot_enabled()) return 0;
  std::lock_guard<std::mutex> lock(g_mu);
  static std::map<int, double> cache;
  const int threads = num_threads();
  if (auto it = cache.find(threads); it != cache.end() && !refresh) return it->second;
  constexpr int64_t kIters = 125'000;
  volatile float seed = 0.5f;
  const double gflops = best_loop_gflops(threads, simd::kBf16DotChainsFlopsPerIter * static_cast<double>(kIters),
                                         [&] { return simd::bf16_dot_chains(kIters, seed); });
  double& roof = cache[threads];
  return roof = std::max(roof, gflops);
#else
  (void)refresh;
  return 0;
#endif
}

void set_roofline_counters(benchmark::State& state, const Work& work, double seconds) {
  double mem_frac = 0, fma_frac = 0;
  if (work.bytes > 0) {
    const double gbps = work.bytes / seconds / 1e9, copy = copy_gbps(static_cast<size_t>(work.bytes), work.cold, true);
    mem_frac = gbps / copy;
    state.counters["GB/s"] = gbps;
    state.counters["copy_GB/s"] = copy;
    if (work.read_roof) state.counters["read_GB/s"] = read_gbps(static_cast<size_t>(work.bytes), work.cold, true);
    state.counters["mem_frac"] = mem_frac;
  }
  if (work.flops > 0) {
    const double gflops = work.flops / seconds / 1e9, roof = fma_gflops(true);
    fma_frac = gflops / roof;
    state.counters["GFLOP/s"] = gflops;
    state.counters["fma_GFLOP/s"] = roof;
    state.counters["fma_frac"] = fma_frac;
    if (work.bf16_dot) {
      if (const double dot = bf16_dot_gflops(true); dot > 0) {
        state.counters["bf16dot_GFLOP/s"] = dot;
        state.counters["dot_frac"] = gflops / dot;
        fma_frac = gflops / dot;  // the binding compute roof
      }
    }
  }
  state.counters["roof_frac"] = std::max(mem_frac, fma_frac);
  state.counters["load"] = load_average();
}

}  // namespace genbridge::bench
#endif  // HWY_ONCE
