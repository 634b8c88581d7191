// quant/* against the memory roof (bench/support/bench_util.h: figure mem_frac, target >= 0.6 of copy),
// bf16 input [rows, K]. Working sets of at least half the LLC rotate through copies of their tensors
// (cold) and compare with the cold copy; smaller ones compare with the warm copy. Bytes moved per call:
//   per-token int8: x read (2K) + q written (K) + scale written (4) per row
//   MXFP8:          x read (2K) + q written (K) + scale written (2 * ceil(ceil(K/32)/2)) per row
//   MXFP4:          x read (2K) + q written (K/2) + scale written, as MXFP8
// MX rows run on builds whose target has an MX data path; elsewhere they are skipped with the reason.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

// Rotated copies of a benchmark's tensors.
template <size_t N>
std::vector<std::array<OwnedTensor, N>> rotated(size_t bytes, const std::array<OwnedTensor, N>& first) {
  return std::vector<std::array<OwnedTensor, N>>(static_cast<size_t>(is_cold(bytes) ? cold_copies(bytes) : 1), first);
}

void BM_per_token_int8(benchmark::State& state) {
  const int64_t rows = state.range(0), k = state.range(1);
  std::array<OwnedTensor, 3> first{OwnedTensor(DType::kBF16, {rows, k}), OwnedTensor(DType::kI8, {rows, k}),
                                   OwnedTensor(DType::kF32, {rows})};
  testing::fill_uniform(first[0].view(), 1, -4.f, 4.f);
  const size_t bytes = static_cast<size_t>(rows * k * 3 + rows * 4);
  auto io = rotated(bytes, first);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = is_cold(bytes)}, [&](int64_t i) {
    auto& t = io[static_cast<size_t>(i) % io.size()];
    const Status st =
        ops::dynamic_quant_per_token(t[0].view(), ops::kDynamicQuantPerTokenDefaultEps, t[1].view(), t[2].view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(is_cold(bytes) ? "cold" : "warm");
}

template <DType kDst>
void BM_mx(benchmark::State& state) {
  const int64_t rows = state.range(0), k = state.range(1);
  ops::MxQuantConfig c;
  c.dst = kDst;
  const bool fp4 = kDst == DType::kFp4E2M1x2;
  const int64_t pairs = ops::mx_scale_pairs(k, c.block_size);
  std::array<OwnedTensor, 3> first{OwnedTensor(DType::kBF16, {rows, k}), OwnedTensor(kDst, {rows, fp4 ? k / 2 : k}),
                                   OwnedTensor(DType::kE8M0, {rows, pairs, 2})};
  testing::fill_uniform(first[0].view(), 1, -4.f, 4.f);
  const Status probe = ops::dynamic_mx_quant(first[0].view(), c, first[1].view(), first[2].view());
  if (!probe.ok()) {
    state.SkipWithError(probe.to_string().c_str());
    return;
  }
  const size_t bytes = static_cast<size_t>(rows * k * 2 + (fp4 ? k / 2 : k) * rows + rows * pairs * 2);
  auto io = rotated(bytes, first);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = is_cold(bytes)}, [&](int64_t i) {
    auto& t = io[static_cast<size_t>(i) % io.size()];
    const Status st = ops::dynamic_mx_quant(t[0].view(), c, t[1].view(), t[2].view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(is_cold(bytes) ? "cold" : "warm");
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "K"});
  for (int64_t rows : {1, 64, 1024, 8192})
    for (int64_t k : {2048, 8192}) b->Args({rows, k});
  b->UseManualTime();
}

BENCHMARK(BM_per_token_int8)->Name("per_token_int8")->Apply(shapes);
BENCHMARK(BM_mx<DType::kFp8E4M3FN>)->Name("mxfp8_e4m3")->Apply(shapes);
BENCHMARK(BM_mx<DType::kFp4E2M1x2>)->Name("mxfp4_e2m1")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
