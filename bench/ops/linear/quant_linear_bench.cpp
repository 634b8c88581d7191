// linear/quant_linear: bf16 x [M, K] times a quantized weight [N, K] -> bf16 y [M, N], per
// scheme, with linear/linear on the bf16 weight in the same run as the baseline (scheme "none"). Bytes =
// the quantized weight (data + scales) + x + y; FLOPs = 2 M N K. Weights are cold (rotated copies, as in
// linear_bench). M = 1 is weight-bandwidth bound: its figure is mem_frac (issue target >= 0.8 of copy, i.e.
// the speed-up over bf16 follows the byte ratio); M >= 64 is compute bound: fma_frac (target >= 0.5).
// A scheme the build's generation cannot run is reported as skipped.
//
// Measured in the same run, per row of a quantized scheme:
//   vs_bf16    the best time of scheme "none" (linear on the bf16 weight, same M, N, K; it runs first)
//              divided by this scheme's best time: the speed-up over bf16 (the target at M = 1:
//              >= 1.7 for W8A8 and MXFP8, >= 3 for MXFP4);
//   mem_frac   (M = 1) the bytes moved (essentially the quantized weight) per second over the copy roof;
//   int8_frac  (W8A8) 2 M N K integer operations per second over int8_GOP/s, the int8 roof: a
//              register-only loop of the multiply-accumulate instruction the W8A8 kernel runs on this
//              CPU target (vpdpbusd, 64 products each, on avx512 with VNNI; else the int16 pairwise
//              multiply-add plus an add), on num_threads() threads, best of 40 runs.
// The label says "w8a8+vnni" when the W8A8 kernel takes its VNNI path.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/parallel.h"
#include "core/simd/dispatch.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "ops/common/linear/int8_dot_kernel.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define HWY_TARGET_INCLUDE "bench/ops/linear/quant_linear_bench.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// ---- The int8 roof: register-only chains of the W8A8 kernel's multiply-accumulate instruction ----------
HWY_BEFORE_NAMESPACE();
namespace genbridge::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kI8Chains = 12;

// 12 independent chains s = s + madd(s as int16 pairs, b): the int16 path's instruction pair per vector.
int32_t I16MaddLoop(int64_t iters, int16_t bv) {
  const hn::ScalableTag<int16_t> d16;
  const hn::Repartition<int32_t, decltype(d16)> d32;
  const auto b = hn::Set(d16, bv);
  hn::Vec<decltype(d32)> s[kI8Chains], t[kI8Chains];
  for (int c = 0; c < kI8Chains; ++c) s[c] = t[c] = hn::Set(d32, c + 1);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kI8Chains; ++c)
      s[c] = hn::ReorderWidenMulAccumulate(d32, hn::BitCast(d16, s[c]), b, s[c], t[c]);
  }
  auto sum = hn::Zero(d32);
  for (int c = 0; c < kI8Chains; ++c) sum = hn::Add(sum, hn::Add(s[c], t[c]));
  return hn::GetLane(hn::SumOfLanes(d32, sum));
}

#if HWY_TARGET == HWY_AVX3
// 12 independent vpdpbusd chains (64 u8 x s8 products each).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t VnniLoop(int64_t iters, int8_t bv) {
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(bv);
  __m512i s[kI8Chains];
  for (int c = 0; c < kI8Chains; ++c) s[c] = _mm512_set1_epi32(c);
  for (int64_t i = 0; i < iters; ++i) {
    for (int c = 0; c < kI8Chains; ++c) s[c] = _mm512_dpbusd_epi32(s[c], a, b);
  }
  __m512i sum = s[0];
  for (int c = 1; c < kI8Chains; ++c) sum = _mm512_add_epi32(sum, s[c]);
  int32_t lanes[16];
  _mm512_storeu_si512(lanes, sum);
  return lanes[0] + lanes[15];
}
#endif

// Runs the chains of the instruction the W8A8 kernel uses on this target; returns their products per
// iteration (into *macs) and a value depending on every chain.
int32_t Int8RoofLoop(int64_t iters, int8_t bv, bool vnni, double* macs) {
#if HWY_TARGET == HWY_AVX3
  if (vnni) {
    *macs = 64.0 * kI8Chains;
    return VnniLoop(iters, bv);
  }
#endif
  (void)vnni;
  *macs = static_cast<double>(kI8Chains * hn::Lanes(hn::ScalableTag<int16_t>()));
  return I16MaddLoop(iters, bv);
}

}  // namespace genbridge::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace genbridge::bench {
HWY_EXPORT(Int8RoofLoop);
namespace {

// Integer operations (2 per product) per second of the int8 roof on num_threads() threads (GOP/s), best
// of 40 short runs; cached per (CPU target, VNNI in use, threads).
double int8_gops() {
  static std::mutex mu;
  static std::map<std::tuple<std::string, bool, int>, double> cache;
  std::lock_guard<std::mutex> lock(mu);
  const bool vnni = ops::detail::int8_vnni_in_use();
  const int threads = num_threads();
  double& roof = cache[{cpu_target(), vnni, threads}];
  const auto loop = GB_DISPATCH(Int8RoofLoop);
  constexpr int64_t kIters = 250'000;
  volatile int8_t bv = 5;
  double macs = 0;
  auto run = [&] {
    genbridge::detail::parallel_for(
        threads, int64_t{1} << 30,
        [&](int64_t b, int64_t e) {
          int32_t sink = 0;
          double m = 0;
          for (int64_t i = b; i < e; ++i) sink += loop(kIters, bv, vnni, &m);
          benchmark::DoNotOptimize(sink);
          if (b == 0) macs = m;
        },
        1);
  };
  double best = 1e30;
  for (int r = 0; r < 40; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return roof = std::max(roof, 2.0 * macs * static_cast<double>(kIters) * threads / best / 1e9);
}

// Best time of scheme "none" per (M, N, K), for the quantized rows that follow it.
std::map<std::tuple<int64_t, int64_t, int64_t>, double>& bf16_seconds() {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> m;
  return m;
}

using ops::WeightQuantScheme;
using testing::OwnedTensor;

constexpr WeightQuantScheme kSchemes[] = {WeightQuantScheme::kNone, WeightQuantScheme::kW8A8, WeightQuantScheme::kMxfp8,
                                          WeightQuantScheme::kMxfp4};

struct QW {
  OwnedTensor data, scale;
};

void BM_quant_linear(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const WeightQuantScheme s = kSchemes[state.range(3)];
  state.SetLabel(std::string(ops::weight_quant_scheme_name(s)) +
                 (s == WeightQuantScheme::kW8A8 && ops::detail::int8_vnni_in_use() ? "+vnni" : ""));
  OwnedTensor x(DType::kBF16, {M, K}), w0(DType::kBF16, {N, K}), y(DType::kBF16, {M, N});
  testing::fill_uniform(x.view(), 1);
  testing::fill_uniform(w0.view(), 2, -0.1f, 0.1f);
  const bool mx = s == WeightQuantScheme::kMxfp8 || s == WeightQuantScheme::kMxfp4;
  const DType elem = s == WeightQuantScheme::kW8A8    ? DType::kI8
                     : s == WeightQuantScheme::kMxfp8 ? DType::kFp8E4M3FN
                                                      : DType::kFp4E2M1x2;
  const int64_t cols = s == WeightQuantScheme::kMxfp4 ? K / 2 : K;
  const std::vector<int64_t> scale_shape =
      mx ? std::vector<int64_t>{N, ops::mx_scale_pairs_of(K), 2} : std::vector<int64_t>{N};
  size_t weight_bytes = static_cast<size_t>(N * K) * 2;
  QW q0{OwnedTensor(elem, {N, cols}), OwnedTensor(mx ? DType::kE8M0 : DType::kF32, scale_shape)};
  if (s != WeightQuantScheme::kNone) {
    const Status st = ops::quantize_weight(w0.view(), {s, q0.data.view(), q0.scale.view(), K});
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      return;
    }
    weight_bytes = static_cast<size_t>(N * cols) + static_cast<size_t>(N * (mx ? 2 * ops::mx_scale_pairs_of(K) : 4));
  }
  const size_t copies = static_cast<size_t>(cold_copies(weight_bytes));
  std::vector<OwnedTensor> wb;
  std::vector<QW> wq;
  if (s == WeightQuantScheme::kNone) {
    wb.assign(copies, w0);
  } else {
    wq.assign(copies, q0);
  }
  const Work work{.bytes = static_cast<double>(weight_bytes + static_cast<size_t>(M * K + M * N) * 2),
                  .flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K),
                  .cold = true,
                  .read_roof = M == 1};
  double best = 1e30;
  run_roofline(state, work, [&](int64_t i) {
    const size_t c = static_cast<size_t>(i) % copies;
    const auto t0 = std::chrono::steady_clock::now();
    const Status st = s == WeightQuantScheme::kNone
                          ? ops::linear(x.view(), wb[c].view(), y.view())
                          : ops::quant_linear(x.view(), {s, wq[c].data.view(), wq[c].scale.view(), K}, y.view());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["w_bytes"] = static_cast<double>(weight_bytes);
  const auto key = std::make_tuple(M, N, K);
  if (s == WeightQuantScheme::kNone) {
    bf16_seconds()[key] = best;
  } else if (auto it = bf16_seconds().find(key); it != bf16_seconds().end()) {
    state.counters["vs_bf16"] = it->second / best;
  }
  if (s == WeightQuantScheme::kW8A8) {
    const double roof = int8_gops();
    state.counters["int8_GOP/s"] = roof;
    state.counters["int8_frac"] = work.flops / best / 1e9 / roof;
  }
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "scheme"});
  for (int64_t m : {1, 64, 256})
    for (int64_t sc = 0; sc < 4; ++sc) b->Args({m, 4096, 4096, sc});
  // A routed expert's gate of the small preset at batch 1 (decode): 0.5 MiB of int8 per call.
  for (int64_t sc = 0; sc < 4; ++sc) b->Args({1, 512, 1024, sc});
  b->UseManualTime();
}

BENCHMARK(BM_quant_linear)->Name("quant_linear")->Apply(shapes);

// W8A8 against bf16 linear with the two calls interleaved (each iteration runs linear on a cold bf16
// weight, then quant_linear on a cold int8 copy of it): on a shared machine both see the same moments,
// so vs_bf16 = best bf16 time / best W8A8 time is steadier than the ratio of two rows. Counters: the best
// times (bf16_us, w8a8_us), vs_bf16, mem_frac (W8A8 bytes moved per second over the copy roof, measured
// after the row) and int8_frac (2 M N K over the best W8A8 time, over the int8 roof).
void BM_w8a8_vs_bf16(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  state.SetLabel(ops::detail::int8_vnni_in_use() ? "w8a8+vnni" : "w8a8");
  OwnedTensor x(DType::kBF16, {M, K}), w0(DType::kBF16, {N, K}), y(DType::kBF16, {M, N});
  testing::fill_uniform(x.view(), 1);
  testing::fill_uniform(w0.view(), 2, -0.1f, 0.1f);
  QW q0{OwnedTensor(DType::kI8, {N, K}), OwnedTensor(DType::kF32, {N})};
  if (const Status st = ops::quantize_weight(w0.view(), {WeightQuantScheme::kW8A8, q0.data.view(), q0.scale.view(), K});
      !st.ok()) {
    state.SkipWithError(st.to_string().c_str());
    return;
  }
  const size_t q_bytes = static_cast<size_t>(N * K + 4 * N), b_bytes = static_cast<size_t>(N * K) * 2;
  const size_t copies = static_cast<size_t>(cold_copies(q_bytes));
  std::vector<OwnedTensor> wb(copies, w0);
  std::vector<QW> wq(copies, q0);
  auto seconds = [](auto&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double best_b = 1e30, best_q = 1e30;
  int64_t i = 0;
  for (auto _ : state) {
    const size_t c = static_cast<size_t>(i++) % copies;
    const double tb = seconds([&] { (void)ops::linear(x.view(), wb[c].view(), y.view()); });
    const double tq = seconds([&] {
      (void)ops::quant_linear(x.view(), {WeightQuantScheme::kW8A8, wq[c].data.view(), wq[c].scale.view(), K}, y.view());
    });
    state.SetIterationTime(tb + tq);
    if (i > 1) {  // the first pair pages in outputs and code
      best_b = std::min(best_b, tb);
      best_q = std::min(best_q, tq);
    }
  }
  const double moved = static_cast<double>(q_bytes + static_cast<size_t>(M * K + M * N) * 2);
  state.counters["bf16_us"] = best_b * 1e6;
  state.counters["w8a8_us"] = best_q * 1e6;
  state.counters["vs_bf16"] = best_b / best_q;
  state.counters["mem_frac"] = moved / best_q / 1e9 / copy_gbps(static_cast<size_t>(moved), true, true);
  state.counters["int8_frac"] = 2.0 * static_cast<double>(M * N * K) / best_q / 1e9 / int8_gops();
  state.counters["load"] = load_average();
  (void)b_bytes;
}

BENCHMARK(BM_w8a8_vs_bf16)
    ->Name("w8a8_vs_bf16")
    ->ArgNames({"M", "N", "K"})
    ->Args({1, 4096, 4096})
    ->Args({1, 512, 1024})
    ->Args({64, 4096, 4096})
    ->UseManualTime();

}  // namespace
}  // namespace genbridge::bench
#endif  // HWY_ONCE
