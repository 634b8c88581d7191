// residual/hyper_connection at DeepSeek-V4-Flash's shape (hidden 4096, n = hc_mult = 4; fn [24, 16384] fp32),
// bf16 streams, against its roofs (bench/support/bench_util.h).
//   hc_pre:  bytes = fn (1.5 MiB) + the streams read + collapsed, post and comb written; FLOPs = 2 M (24 + 2) n H
//            (the projection, x . x, the collapse). Every call reads another copy of fn and of the streams, as a
//            model's 2 sites per layer do at each decode step, so the weights are cold: the memory roof is the
//            cold copy and the read-only stream (figures: mem_frac at M = 1 and 8, roof_frac at 64).
//   hc_post: bytes = streams and y read + out written (+ post, comb); memory-bound (figure: mem_frac). Working
//            sets of at least half the LLC rotate through copies (cold), smaller ones stay cached (warm), as
//            bench/ops/norm does.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "genbridge/ops/residual/hyper_connection.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

struct PreIo {
  OwnedTensor streams, fn;
};

void BM_hc_pre(benchmark::State& state) {
  const int64_t M = state.range(0), H = state.range(1), n = state.range(2), N = (2 + n) * n;
  OwnedTensor base(DType::kF32, {N}), scale(DType::kF32, {3}), collapsed(DType::kBF16, {M, H}),
      post(DType::kF32, {M, n}), comb(DType::kF32, {M, n, n});
  testing::fill_uniform(base.view(), 3, -1.f, 1.f);
  testing::fill_uniform(scale.view(), 4, 0.5f, 2.f);
  PreIo first{OwnedTensor(DType::kBF16, {M, n, H}), OwnedTensor(DType::kF32, {N, n * H})};
  testing::fill_uniform(first.streams.view(), 1, -3.f, 3.f);
  testing::fill_uniform(first.fn.view(), 2, -0.02f, 0.02f);
  const size_t in_bytes = static_cast<size_t>(N * n * H) * 4 + static_cast<size_t>(M * n * H) * 2;
  const size_t bytes = in_bytes + static_cast<size_t>(M * H) * 2 + static_cast<size_t>(M * (n + n * n)) * 4;
  std::vector<PreIo> io(static_cast<size_t>(cold_copies(in_bytes)), first);
  const ops::HyperConnectionParams p{1e-6f, 1e-6f, 20};
  const Work work{.bytes = static_cast<double>(bytes),
                  .flops = 2.0 * static_cast<double>(M * (N + 2) * n * H),
                  .cold = true,
                  .read_roof = true};
  run_roofline(state, work, [&](int64_t i) {
    PreIo& b = io[static_cast<size_t>(i) % io.size()];
    const Status st = ops::hc_pre(b.streams.view(), b.fn.view(), base.view(), scale.view(), p, collapsed.view(),
                                  post.view(), comb.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel("bf16 streams, fp32 fn, cold");
}

struct PostIo {
  OwnedTensor y, post, comb, streams, out;
};

void BM_hc_post(benchmark::State& state) {
  const int64_t M = state.range(0), H = state.range(1), n = state.range(2);
  PostIo first{OwnedTensor(DType::kBF16, {M, H}), OwnedTensor(DType::kF32, {M, n}), OwnedTensor(DType::kF32, {M, n, n}),
               OwnedTensor(DType::kBF16, {M, n, H}), OwnedTensor(DType::kBF16, {M, n, H})};
  testing::fill_uniform(first.y.view(), 1, -3.f, 3.f);
  testing::fill_uniform(first.post.view(), 2, 0.f, 2.f);
  testing::fill_uniform(first.comb.view(), 3, 0.f, 0.5f);
  testing::fill_uniform(first.streams.view(), 4, -3.f, 3.f);
  const size_t bytes = static_cast<size_t>(M * H) * 2 + static_cast<size_t>(M * (n + n * n)) * 4 +
                       static_cast<size_t>(2 * M * n * H) * 2;
  const bool cold = is_cold(bytes);
  std::vector<PostIo> io(static_cast<size_t>(cold ? cold_copies(bytes) : 1), first);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = cold}, [&](int64_t i) {
    PostIo& b = io[static_cast<size_t>(i) % io.size()];
    const Status st = ops::hc_post(b.y.view(), b.post.view(), b.comb.view(), b.streams.view(), b.out.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetLabel(std::string("bf16") + (cold ? " cold" : " warm"));
}

void pre_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "H", "n"});
  for (int64_t m : {1, 8, 64}) b->Args({m, 4096, 4});
  b->UseManualTime();
}

void post_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "H", "n"});
  for (int64_t m : {1, 8, 64, 512}) b->Args({m, 4096, 4});
  b->UseManualTime();
}

BENCHMARK(BM_hc_pre)->Name("hc_pre")->Apply(pre_shapes);
BENCHMARK(BM_hc_post)->Name("hc_post")->Apply(post_shapes);

}  // namespace
}  // namespace genbridge::bench
