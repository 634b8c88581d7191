// linear/quant_linear (issue 13): bf16 x [M, K] times a quantized weight [N, K] -> bf16 y [M, N], per
// scheme, with linear/linear on the bf16 weight in the same run as the baseline (scheme "none"). Bytes =
// the quantized weight (data + scales) + x + y; FLOPs = 2 M N K. Weights are cold (rotated copies, as in
// linear_bench). M = 1 is weight-bandwidth bound: its figure is mem_frac (issue target >= 0.8 of copy, i.e.
// the speed-up over bf16 follows the byte ratio); M >= 64 is compute bound: fma_frac (target >= 0.5). x_bf16: the
// speed-up over scheme "none" at the same M, both measured in this run.
// A scheme the build's generation cannot run is reported as skipped.
#include <benchmark/benchmark.h>

#include <map>
#include <vector>

#include "genbridge/ops/linear/linear.h"
#include "genbridge/ops/linear/quant_linear.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

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
  state.SetLabel(std::string(ops::weight_quant_scheme_name(s)));
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
  run_roofline(state, work, [&](int64_t i) {
    const size_t c = static_cast<size_t>(i) % copies;
    const Status st = s == WeightQuantScheme::kNone
                          ? ops::linear(x.view(), wb[c].view(), y.view())
                          : ops::quant_linear(x.view(), {s, wq[c].data.view(), wq[c].scale.view(), K}, y.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["w_bytes"] = static_cast<double>(weight_bytes);
  // Speed-up over linear/linear on the bf16 weight (scheme "none", run just before at the same M), from each
  // one's best call: the batch-1 targets are MXFP4 >= 3x, MXFP8 / W8A8 >= 1.7x.
  static std::map<int64_t, double> none_seconds;
  const double seconds = work.flops / (state.counters["GFLOP/s"] * 1e9);
  if (s == WeightQuantScheme::kNone) none_seconds[M] = seconds;
  if (none_seconds.count(M) != 0) state.counters["x_bf16"] = none_seconds[M] / seconds;
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "N", "K", "scheme"});
  for (int64_t m : {1, 64, 256})
    for (int64_t sc = 0; sc < 4; ++sc) b->Args({m, 4096, 4096, sc});
  b->UseManualTime();
}

BENCHMARK(BM_quant_linear)->Name("quant_linear")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
