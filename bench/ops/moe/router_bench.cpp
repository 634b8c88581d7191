// The routers (moe/topk_router, moe/grouped_topk_router, moe/sqrt_softplus_router) against the memory roof
// (bench/support/bench_util.h). T tokens, E experts, top-k; fp32 logits as the engine passes them. Bytes =
// the logits read + the ids and weights written (+ the bias); the routers are bound by their per-expert
// transcendental (exp, log1p, sqrt) and the selection, so mem_frac says how far they are from a streaming
// pass over the same bytes. A step's router time is T x (its per-token time): the rows' us/token next to a
// decode step's milliseconds (docs/bench/engine.md) show its share. Shapes: the `small` presets' 32 experts
// top-4, DeepSeek-V3's 256 top-8 (8 groups, top 4 groups) and V4-Flash's 256 top-6.
#include <benchmark/benchmark.h>

#include <vector>

#include "genbridge/ops/moe/grouped_topk_router.h"
#include "genbridge/ops/moe/sqrt_softplus_router.h"
#include "genbridge/ops/moe/topk_router.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

enum Kind : int64_t { kSoftmax = 0, kGrouped = 1, kSqrtSoftplus = 2 };

void BM_router(benchmark::State& state) {
  const auto kind = static_cast<Kind>(state.range(0));
  const int64_t T = state.range(1), E = state.range(2), k = state.range(3);
  OwnedTensor logits(DType::kF32, {T, E}), bias(DType::kF32, {E}), ids(DType::kI32, {T, k}),
      weights(DType::kF32, {T, k});
  testing::fill_uniform(logits.view(), 1, -4.f, 4.f);
  testing::fill_uniform(bias.view(), 2, -0.1f, 0.1f);
  const Work work{.bytes = static_cast<double>(T * E * 4 + E * 4 + T * k * 8)};
  const TensorView none;
  run_roofline(state, work, [&](int64_t) {
    Status st;
    switch (kind) {
      case kSoftmax:
        st = ops::topk_router(logits.view(), true, ids.view(), weights.view());
        break;
      case kGrouped:
        st = ops::grouped_topk_router(
            logits.view(), bias.view(),
            ops::GroupedTopkParams{
                .n_group = 8, .topk_group = 4, .norm_topk_prob = true, .routed_scaling_factor = 2.5f},
            ids.view(), weights.view());
        break;
      case kSqrtSoftplus:
        st = ops::sqrt_softplus_router(logits.view(), bias.view(), none, true, 1.5f, ids.view(), weights.view());
        break;
    }
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.SetItemsProcessed(state.iterations() * T);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kind", "T", "E", "k"});
  for (int64_t t : {1, 32, 512}) {
    b->Args({kSoftmax, t, 32, 4});
    b->Args({kSqrtSoftplus, t, 32, 4});
    b->Args({kGrouped, t, 256, 8});
    b->Args({kSqrtSoftplus, t, 256, 6});
  }
  b->UseManualTime();
}

// kind: 0 softmax top-k (Qwen3-MoE), 1 grouped sigmoid top-k (DeepSeek-V3), 2 sqrt-softplus top-k (DeepSeek-V4).
BENCHMARK(BM_router)->Name("router")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
