// moe/expert_ffn, bf16, against its roofs (bench/support/bench_util.h). M tokens, each routed to k of E
// experts (distinct per token, seeded). Bytes = the gate, up and down weights of every expert the batch
// routes to (3 I H each, read once) + x + out; FLOPs = 6 M k H I. The weights are cold: calls rotate
// through several routings so that what one call reads is out of the last-level cache when it is read
// again (see below); the memory roof is the cold copy.
// M = 1 is weight-bandwidth bound (figure: mem_frac, target >= 0.8); M >= 64 is compute bound (figure:
// fma_frac, target >= 0.6). Shapes: 16 experts top-8 at H 2048 / I 768, and the `small` preset's
// 32 experts top-4 at H 1024 / I 512. packed:1 rows: the weights packed once before the timing
// (ops/linear/packed_weights.h, as the engine does at load); packed:0 rows read the checkpoint layout.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "genbridge/ops/moe/expert_ffn.h"
#include "support/bench_util.h"
#include "support/tensor_util.h"

namespace genbridge::bench {
namespace {

using testing::OwnedTensor;

void BM_expert_ffn(benchmark::State& state) {
  const int64_t M = state.range(0), H = state.range(1), I = state.range(2), E = state.range(3), k = state.range(4);
  const bool packed = state.range(5) != 0;
  OwnedTensor x(DType::kBF16, {M, H}), out(DType::kBF16, {M, k, H}), wg(DType::kBF16, {E, I, H}),
      wu(DType::kBF16, {E, I, H}), wd(DType::kBF16, {E, H, I});
  testing::fill_uniform(x.view(), 1);
  testing::fill_uniform(wg.view(), 2, -0.05f, 0.05f);
  testing::fill_uniform(wu.view(), 3, -0.05f, 0.05f);
  testing::fill_uniform(wd.view(), 4, -0.05f, 0.05f);
  // packed:1: every expert's weights packed once, before the timing (as the engine does at load).
  std::vector<ops::PackedExpertWeights> packs;
  std::vector<ops::ExpertWeights> experts_w;
  std::shared_ptr<void> arena;  // one allocation for all, as the engine's ExpertBank makes per layer
  if (packed) {
    for (int64_t e = 0; e < E; ++e) {
      const ops::ExpertWeights w{wg.view().slice0(e, e + 1).reshaped({I, H}),
                                 wu.view().slice0(e, e + 1).reshaped({I, H}),
                                 wd.view().slice0(e, e + 1).reshaped({H, I})};
      const size_t per = ops::packed_expert_bytes(w);
      if (!arena) arena = ops::allocate_packed(per * static_cast<size_t>(E));
      auto p = ops::pack_expert_weights(w, static_cast<char*>(arena.get()) + e * per);
      if (!p.ok()) return state.SkipWithError(p.status().to_string().c_str());
      packs.push_back(std::move(*p));
      experts_w.push_back(w);
    }
    for (int64_t e = 0; e < E; ++e) experts_w[e].packed = &packs[e];
  }
  const size_t expert_bytes = static_cast<size_t>(3 * I * H) * 2;
  // Routings rotated call after call. M = 1: E / k disjoint ones, so a full rotation reads every expert
  // once (all the weights, >= 3 x LLC here) before an expert is read again. M > 1: 4 random ones.
  std::mt19937_64 rng(5);
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int32_t e = 0; e < E; ++e) perm[e] = e;
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t routings = M == 1 ? E / k : 4;
  std::vector<OwnedTensor> ids(static_cast<size_t>(routings), OwnedTensor(DType::kI32, {M, k}));
  double weight_bytes = 0, experts = 0;
  for (int64_t r = 0; r < routings; ++r) {
    std::set<int32_t> active;
    for (int64_t t = 0; t < M; ++t) {
      if (M > 1) std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = perm[M == 1 ? r * k + j : j];
        ids[r].view().data_as<int32_t>()[t * k + j] = e;
        active.insert(e);
      }
    }
    experts += static_cast<double>(active.size()) / routings;
    weight_bytes += static_cast<double>(active.size() * expert_bytes) / routings;
  }
  const Work work{.bytes = weight_bytes + static_cast<double>(M * H * 2 + M * k * H * 2),
                  .flops = 6.0 * static_cast<double>(M * k) * static_cast<double>(H * I),
                  .cold = true,
                  .read_roof = M == 1};
  run_roofline(state, work, [&](int64_t i) {
    const TensorView& id = ids[static_cast<size_t>(i) % ids.size()].view();
    const Status st = packed ? ops::expert_ffn(x.view(), id, experts_w, 0, E, out.view())
                             : ops::expert_ffn(x.view(), id, wg.view(), wu.view(), wd.view(), 0, E, out.view());
    if (!st.ok()) state.SkipWithError(st.to_string().c_str());
  });
  state.counters["experts"] = experts;
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "H", "I", "E", "k", "packed"});
  for (auto [h, i, e, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{2048, 768, 16, 8}, {1024, 512, 32, 4}})
    for (int64_t m : {1, 8, 32, 64, 256, 512})
      for (int64_t packed : {0, 1}) b->Args({m, h, i, e, k, packed});
  b->UseManualTime();
}

BENCHMARK(BM_expert_ffn)->Name("expert_ffn")->Apply(shapes);

}  // namespace
}  // namespace genbridge::bench
