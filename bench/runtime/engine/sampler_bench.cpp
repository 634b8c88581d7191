// engine::sample_token on one 151,936-token logits row (Qwen3's vocabulary) against the memory roof of reading
// the row once (bench/support/bench_util.h): greedy, temperature 1 over every token (the radix sort), top-k 50
// with top-p 0.95 (a partial sort), and a peaked row whose tail is left out before sorting. The row's logits are
// a uniform spread of 12 (a random model's) or that spread under a head 30 above it (a trained model's).
#include <benchmark/benchmark.h>

#include <vector>

#include "runtime/engine/sampler.h"
#include "support/bench_util.h"

namespace genbridge::bench {
namespace {

void BM_sample(benchmark::State& state) {
  const int64_t mode = state.range(0), peaked = state.range(1);
  const size_t vocab = 151936;
  std::vector<float> logits(vocab);
  uint64_t r = 1;
  for (float& x : logits) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(r >> 11) * 0x1.0p-53 * 12.0 - 6.0);
  }
  if (peaked) {
    for (size_t i = 0; i < 32; ++i) logits[i * 4099 % vocab] = 30.f + static_cast<float>(i) * 0.1f;
  }
  std::vector<int32_t> scratch(vocab);
  engine::SamplingParams p;
  if (mode == 1) p = {.temperature = 1.f, .seed = 3};
  if (mode == 2) p = {.temperature = 0.8f, .top_k = 50, .top_p = 0.95f, .seed = 3};
  const Work work{.bytes = static_cast<double>(vocab * sizeof(float))};
  run_roofline(state, work, [&](int64_t i) {
    auto t = engine::sample_token(logits, p, static_cast<uint64_t>(i), scratch);
    if (!t.ok()) state.SkipWithError(t.status().to_string().c_str());
    benchmark::DoNotOptimize(t);
  });
}

// mode: 0 greedy, 1 temperature 1 (every token), 2 top-k 50 + top-p 0.95; peaked: 0 a flat spread, 1 a head.
BENCHMARK(BM_sample)
    ->Name("sample_token")
    ->ArgNames({"mode", "peaked"})
    ->ArgsProduct({{0, 1, 2}, {0, 1}})
    ->UseManualTime();

}  // namespace
}  // namespace genbridge::bench
