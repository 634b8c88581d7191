#pragma once
// Shared pieces of the engine tests: synthetic checkpoints cached per program, a fresh engine per run,
// and the comparison of recorded logits with the independent fp64 reference forward (teacher-forced on
// the engine's own tokens, so a late step is compared even when an earlier near-tie picked another token).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "support/reference_forward.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::engine::harness {

using model::Checkpoint;

// One model directory per preset for the whole test program (seed 7).
inline const Checkpoint& checkpoint(const std::string& preset) {
  static genbridge::testing::TempDir dir;
  static std::map<std::string, std::unique_ptr<Checkpoint>> cache;
  auto& slot = cache[preset];
  if (!slot) {
    const auto path = dir / preset;
    const Status st = model::write_synthetic_checkpoint(preset, 7, path);
    EXPECT_TRUE(st.ok()) << st.to_string();
    auto ck = Checkpoint::open(path);
    EXPECT_TRUE(ck.ok()) << ck.status().to_string();
    slot = std::make_unique<Checkpoint>(std::move(ck).value());
  }
  return *slot;
}

struct RunConfig {
  std::string preset = "tiny";
  std::string kv_cache_dtype = "auto";
  int64_t max_batch = 8;
  int64_t pool_pages = 64;
  bool record_logits = true;
  int64_t max_prefill_tokens = 4096;
  bool record_choices = false;
  int64_t max_num_batched_tokens = 0;  // chunked prefill's budget per step (0: whole prompts)
  Preemption preemption = Preemption::kOff;
};

// n tokens uniform over the vocabulary, a fixed function of (salt, position).
inline std::vector<int32_t> prompt_of(int64_t n, uint64_t salt, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(uniform_from(salt, i) * static_cast<double>(vocab)));
  return p;
}

inline Request request_of(int64_t id, int64_t prompt_len, int max_new, int64_t vocab, uint64_t salt = 0) {
  Request q;
  q.id = id;
  q.prompt = prompt_of(prompt_len, salt ? salt : 100 + static_cast<uint64_t>(id), vocab);
  q.max_new_tokens = max_new;
  return q;
}

// What one engine run observed besides its results.
struct RunTrace {
  Status status;
  int64_t max_pages_in_use = 0;  // most pool pages held at the end of any iteration
  int64_t max_waiting = 0;       // most requests waiting at the end of any iteration
  int64_t max_running = 0;       // most requests running at the end of any iteration
  EngineMetrics metrics;         // the engine's, at the end
};

// Runs `reqs` through a fresh engine on `ck` (DeviceOperator of this build, pool of rc.pool_pages pages;
// rc.preset is ignored) and returns the results. Asserts success unless `trace` is given (then its status
// says how the run ended).
inline std::vector<RequestResult> run_engine_on(const Checkpoint& ck, const RunConfig& rc, std::vector<Request> reqs,
                                                RunTrace* trace = nullptr) {
  const model::ModelConfig& c = ck.config();
  auto dev = runtime::DeviceOperator::create({.kv_cache_dtype = rc.kv_cache_dtype});
  EXPECT_TRUE(dev.ok()) << dev.status().to_string();
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(model::kv_model_shape(c)), rc.pool_pages, rc.max_batch);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  auto runner = model::ModelRunner::create(ck, *dev, *pool);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  LocalExecutor executor(**runner);
  Engine eng(executor, *pool,
             {.max_batch = rc.max_batch,
              .max_prefill_tokens = rc.max_prefill_tokens,
              .max_num_batched_tokens = rc.max_num_batched_tokens,
              .record_logits = rc.record_logits,
              .record_choices = rc.record_choices,
              .preemption = rc.preemption});
  for (auto& r : reqs) EXPECT_TRUE(eng.submit(std::move(r)).ok());
  RunTrace local;
  RunTrace& t = trace ? *trace : local;
  t.status = eng.run_to_completion([&](const Progress& p) {
    t.max_pages_in_use = std::max(t.max_pages_in_use, pool->used_pages());
    t.max_waiting = std::max(t.max_waiting, p.waiting);
    t.max_running = std::max(t.max_running, p.running);
  });
  t.metrics = eng.metrics();
  if (!trace) {
    EXPECT_TRUE(t.status.ok()) << t.status.to_string();
  }
  EXPECT_EQ(pool->used_pages(), 0) << "finished requests must return their pages";
  return eng.results();
}

// run_engine_on the cached checkpoint of rc.preset.
inline std::vector<RequestResult> run_engine(const RunConfig& rc, std::vector<Request> reqs,
                                             RunTrace* trace = nullptr) {
  return run_engine_on(checkpoint(rc.preset), rc, std::move(reqs), trace);
}

// `got` ends every request as `want` does, with the same tokens and the same recorded logits, bit for bit.
inline void expect_same_results(const std::vector<RequestResult>& got, const std::vector<RequestResult>& want,
                                const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].reason, want[r].reason) << what << "request " << r << ": " << got[r].message;
    EXPECT_EQ(got[r].tokens, want[r].tokens) << what << "request " << r;
    EXPECT_EQ(got[r].logits, want[r].logits) << what << "request " << r;
  }
}

// Relative L2 error of one logits row against the reference.
inline double rel_l2(std::span<const float> got, std::span<const double> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// The engine computes in bf16 activations with fp32 accumulation; the reference in fp64 on the same (bf16)
// weights. Each bf16 rounding has relative error <= 2^-9; a few dozen roundings per layer through residual
// adds, norms and projections over 4 layers give logits within ~1.5% relative L2 (observed, printed). We
// require <= 3% per step with bf16 KV. One exception is legitimate: the router sees bf16 hidden states, so
// its logits carry an error of ~0.01-0.03 (router logits have std ~2); where the reference's gap between
// the k-th and (k+1)-th expert at the step's position is below the routing margin in some MoE layer, the
// engine may pick the other expert, and that step's logits are not compared (at least 3/4 of the steps
// must be). Where the reference's top-2 logit gap exceeds twice the observed absolute error, the greedy
// token must match.
struct ReferenceCheck {
  double tolerance = 3e-2;       // bound on each compared step's relative L2 logit error
  double routing_margin = 0.05;  // steps whose smallest reference top-k margin is below this are skipped
  double min_compared = 0.75;    // fraction of the steps that must be compared
  bool greedy = true;            // also check the token where the reference's choice is clear
};
inline constexpr ReferenceCheck kBf16KvCheck{};

// Steps of the requests compared with the reference (a request too long for this build adds none), and how
// many of them had a clear routing decision and were checked.
struct ReferenceComparison {
  size_t steps = 0, compared = 0;
  double worst = 0;  // worst relative L2 logit error over the compared steps
  ReferenceComparison& operator+=(const ReferenceComparison& o) {
    steps += o.steps;
    compared += o.compared;
    worst = std::max(worst, o.worst);
    return *this;
  }
};

inline void expect_enough_compared(const ReferenceComparison& c, const ReferenceCheck& check,
                                   const std::string& label) {
  EXPECT_GE(static_cast<double>(c.compared), check.min_compared * static_cast<double>(c.steps))
      << label << ": too few steps with a clear routing decision to compare (" << c.compared << " of " << c.steps
      << ")";
}

// Compares every recorded step of `result` (logits recorded) for `prompt` with the fp64 reference forward
// over prompt + generated tokens (the last generated token is never fed back). Checks each compared step
// (see ReferenceCheck); the caller checks the compared fraction (expect_enough_compared), per request or
// over several short ones.
inline ReferenceComparison compare_steps_with_reference(const Checkpoint& ck, const std::vector<int32_t>& prompt,
                                                        const RequestResult& result, const ReferenceCheck& check,
                                                        const std::string& label) {
  const int64_t vocab = ck.config().vocab_size;
  const auto& tokens = result.tokens;
  ReferenceComparison out;
  out.steps = tokens.size();
  EXPECT_EQ(result.logits.size(), tokens.size() * static_cast<size_t>(vocab)) << label << ": logits not recorded";
  if (tokens.empty() || result.logits.size() != tokens.size() * static_cast<size_t>(vocab)) return out;
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), tokens.begin(), tokens.end() - 1);
  const genbridge::testing::ReferenceForward ref =
      genbridge::testing::reference_forward(ck.config(), ck.weights(), seq);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t pos = static_cast<int64_t>(prompt.size() + i) - 1;
    std::span<const float> got(result.logits.data() + i * vocab, static_cast<size_t>(vocab));
    const auto want = ref.logits_at(pos);
    double margin = INFINITY;
    for (const auto& layer : ref.topk_margin) {
      if (!layer.empty()) margin = std::min(margin, layer[pos]);
    }
    if (margin < check.routing_margin) continue;
    ++out.compared;
    const double err = rel_l2(got, want);
    out.worst = std::max(out.worst, err);
    EXPECT_LE(err, check.tolerance) << label << " step " << i << " (position " << pos << ", routing margin " << margin
                                    << ")";
    if (!check.greedy) continue;
    double max_abs = 0;
    for (int64_t v = 0; v < vocab; ++v) max_abs = std::max(max_abs, std::abs(got[v] - want[v]));
    std::vector<double> sorted(want.begin(), want.end());
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const int64_t ref_argmax = std::max_element(want.begin(), want.end()) - want.begin();
    if (sorted[0] - sorted[1] > 2 * max_abs) {
      EXPECT_EQ(tokens[i], ref_argmax) << label << " step " << i << " (position " << pos << ")";
    }
  }
  std::printf("%s: %zu steps, %zu compared, worst relative L2 logit error vs fp64 reference %.4f\n", label.c_str(),
              out.steps, out.compared, out.worst);
  return out;
}

// compare_steps_with_reference and the compared fraction of this one request.
inline ReferenceComparison compare_with_reference(const Checkpoint& ck, const std::vector<int32_t>& prompt,
                                                  const RequestResult& result, const ReferenceCheck& check,
                                                  const std::string& label) {
  const ReferenceComparison c = compare_steps_with_reference(ck, prompt, result, check, label);
  expect_enough_compared(c, check, label);
  return c;
}

}  // namespace genbridge::engine::harness
