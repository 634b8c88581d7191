// quant/* bandwidth against the same-binary copy kernel, bf16 input [rows, K]. Bytes moved per call:
//   per-token int8: x read (2K) + q written (K) + scale written (4) per row
//   MXFP8:          x read (2K) + q written (K) + scale written (2 * ceil(ceil(K/32)/2)) per row
//   MXFP4:          x read (2K) + q written (K/2) + scale written, as MXFP8
// MX rows run on builds whose target has an MX data path; elsewhere they are skipped with the reason.
#include <benchmark/benchmark.h>

#include <string>

#include "genbridge/ops/quant/dynamic_mx_quant.h"
#include "genbridge/ops/quant/dynamic_quant_per_token.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

void BM_per_token_int8(benchmark::State& state) {
  const int64_t rows = state.range(0), k = state.range(1);
  OwnedTensor x(DType::kBF16, {rows, k}), q(DType::kI8, {rows, k}), s(DType::kF32, {rows});
  testing::fill_uniform(x.view(), 1, -4.f, 4.f);
  const size_t bytes = static_cast<size_t>(rows * k * 3 + rows * 4);
  run_memory_bound(state, bytes, [&] {
    const Status st = ops::dynamic_quant_per_token(x.view(), ops::kDynamicQuantPerTokenDefaultEps, q.view(), s.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
}

template <DType kDst>
void BM_mx(benchmark::State& state) {
  const int64_t rows = state.range(0), k = state.range(1);
  ops::MxQuantConfig c;
  c.dst = kDst;
  const bool fp4 = kDst == DType::kFp4E2M1x2;
  const int64_t pairs = ops::mx_scale_pairs(k, c.block_size);
  OwnedTensor x(DType::kBF16, {rows, k}), q(kDst, {rows, fp4 ? k / 2 : k}), s(DType::kE8M0, {rows, pairs, 2});
  testing::fill_uniform(x.view(), 1, -4.f, 4.f);
  const Status probe = ops::dynamic_mx_quant(x.view(), c, q.view(), s.view());
  if (!probe.ok()) {
    state.SkipWithError(probe.to_string().c_str());
    return;
  }
  const size_t bytes = static_cast<size_t>(rows * k * 2 + (fp4 ? k / 2 : k) * rows + rows * pairs * 2);
  run_memory_bound(state, bytes, [&] {
    const Status st = ops::dynamic_mx_quant(x.view(), c, q.view(), s.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "K"});
  for (int64_t rows : {1, 16, 64, 256, 1024, 4096})
    for (int64_t k : {2048, 4096, 8192}) b->Args({rows, k});
  b->UseManualTime();
}

BENCHMARK(BM_per_token_int8)->Name("per_token_int8")->Apply(shapes);
BENCHMARK(BM_mx<DType::kFp8E4M3FN>)->Name("mxfp8_e4m3")->Apply(shapes);
BENCHMARK(BM_mx<DType::kFp4E2M1x2>)->Name("mxfp4_e2m1")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
