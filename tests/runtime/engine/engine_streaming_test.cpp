// The engine's streaming use (a server): a listener receives every token in order and every finished
// request once; cancel() ends a waiting or running request and frees its KV pages; step() by step()
// gives the same tokens as run_to_completion.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine_harness.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;

struct Streamed {
  std::map<int64_t, std::vector<int32_t>> tokens;          // from on_token
  std::map<int64_t, RequestResult> finished;               // from on_finish
  std::map<int64_t, std::vector<TokenLogprobs>> logprobs;  // from on_token
  std::vector<int64_t> finish_order;                       // ids, as on_finish saw them
};

class StreamingEngine {
 public:
  explicit StreamingEngine(int64_t pool_pages, int64_t max_batch = 8, bool record_logits = false,
                           SchedulingPolicy policy = SchedulingPolicy::kFcfs) {
    const model::ModelConfig& c = checkpoint("tiny").config();
    dev_ = std::make_unique<runtime::DeviceOperator>(runtime::DeviceOperator::create({}).value());
    pool_ = std::make_unique<runtime::KvPagePool>(
        runtime::KvPagePool::create(dev_->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}),
                                    pool_pages)
            .value());
    runner_ = model::ModelRunner::create(checkpoint("tiny"), *dev_, *pool_).value();
    executor_ = std::make_unique<LocalExecutor>(*runner_);
    engine_ = std::make_unique<Engine>(
        *executor_, *pool_, EngineOptions{.max_batch = max_batch, .record_logits = record_logits, .policy = policy});
    engine_->set_listener({.on_token =
                               [this](int64_t id, int32_t t, const TokenLogprobs* lp) {
                                 out.tokens[id].push_back(t);
                                 if (lp) out.logprobs[id].push_back(*lp);
                               },
                           .on_finish =
                               [this](RequestResult&& r) {
                                 EXPECT_EQ(out.finished.count(r.id), 0u) << "request " << r.id << " finished twice";
                                 out.finish_order.push_back(r.id);
                                 out.finished[r.id] = std::move(r);
                               }});
  }
  Engine& engine() { return *engine_; }
  runtime::KvPagePool& pool() { return *pool_; }
  Streamed out;

 private:
  std::unique_ptr<runtime::DeviceOperator> dev_;
  std::unique_ptr<runtime::KvPagePool> pool_;
  std::unique_ptr<model::ModelRunner> runner_;
  std::unique_ptr<LocalExecutor> executor_;
  std::unique_ptr<Engine> engine_;
};

TEST(EngineStreaming, listener_sees_the_tokens_run_to_completion_gives_and_results_stay_empty) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  std::vector<Request> reqs;
  for (int r = 0; r < 4; ++r) reqs.push_back(request_of(r, 3 + 5 * r, 6, vocab));
  const auto want = run_engine({.record_logits = false}, reqs);
  StreamingEngine s(64);
  for (auto r : reqs) ASSERT_TRUE(s.engine().submit(std::move(r)).ok());
  for (int i = 0; i < 100 && s.engine().has_work(); ++i) ASSERT_TRUE(s.engine().step().ok());
  EXPECT_FALSE(s.engine().has_work());
  EXPECT_TRUE(s.engine().results().empty());
  for (const auto& w : want) {
    EXPECT_EQ(s.out.tokens[w.id], w.tokens) << "request " << w.id;
    EXPECT_EQ(s.out.finished[w.id].tokens, w.tokens) << "request " << w.id;
    EXPECT_EQ(s.out.finished[w.id].reason, FinishReason::kLength);
  }
  EXPECT_EQ(s.pool().used_pages(), 0);
  // A finished request's id may be used again in streaming use.
  EXPECT_TRUE(s.engine().submit(request_of(0, 3, 2, vocab)).ok());
}

TEST(EngineStreaming, cancel_ends_running_and_waiting_requests_and_frees_their_pages) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  StreamingEngine s(4, /*max_batch=*/1);  // request 1 waits while request 0 runs
  ASSERT_TRUE(s.engine().submit(request_of(0, 5, 100, vocab)).ok());
  ASSERT_TRUE(s.engine().submit(request_of(1, 5, 100, vocab)).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.engine().step().ok());
  EXPECT_EQ(s.engine().num_running(), 1);
  EXPECT_EQ(s.engine().num_waiting(), 1);
  EXPECT_GT(s.pool().used_pages(), 0);
  EXPECT_TRUE(s.engine().cancel(1));  // waiting
  EXPECT_TRUE(s.engine().cancel(0));  // running
  EXPECT_FALSE(s.engine().cancel(0));
  EXPECT_FALSE(s.engine().cancel(7));
  EXPECT_FALSE(s.engine().has_work());
  EXPECT_EQ(s.pool().used_pages(), 0);
  EXPECT_EQ(s.out.finished[0].reason, FinishReason::kCancelled);
  EXPECT_EQ(s.out.finished[0].tokens.size(), 3u);
  EXPECT_EQ(s.out.finished[0].tokens, s.out.tokens[0]);
  EXPECT_EQ(s.out.finished[1].reason, FinishReason::kCancelled);
  EXPECT_TRUE(s.out.finished[1].tokens.empty());
  EXPECT_EQ(s.engine().metrics().requests_cancelled, 2);
  EXPECT_STREQ(finish_reason_name(FinishReason::kCancelled), "cancelled");
}

TEST(EngineStreaming, refused_request_reaches_the_listener) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  StreamingEngine s(2);
  ASSERT_TRUE(s.engine().submit(request_of(9, 200, 100, vocab)).ok());
  ASSERT_TRUE(s.engine().step().ok());
  EXPECT_EQ(s.out.finished[9].reason, FinishReason::kRefused);
  EXPECT_FALSE(s.out.finished[9].message.empty());
  EXPECT_FALSE(s.engine().has_work());
}

// Logprobs: only requests that ask get them (the listener sees nullptr for the others); each is the fp64
// log-softmax of the raw logits the token was drawn from (before temperature / top-k / top-p: the model's
// own distribution), the top k most likely first; the listener and the result carry the same values.
TEST(EngineStreaming, logprobs_are_the_log_softmax_of_the_raw_logits_and_only_for_requests_that_ask) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  StreamingEngine s(64, 8, /*record_logits=*/true);
  Request sampled = request_of(0, 7, 5, vocab);
  sampled.logprobs = 4;
  sampled.sampling = {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f, .seed = 3};
  Request greedy = request_of(1, 4, 5, vocab);
  greedy.logprobs = 0;
  ASSERT_TRUE(s.engine().submit(std::move(sampled)).ok());
  ASSERT_TRUE(s.engine().submit(std::move(greedy)).ok());
  ASSERT_TRUE(s.engine().submit(request_of(2, 5, 5, vocab)).ok());
  for (int i = 0; i < 100 && s.engine().has_work(); ++i) ASSERT_TRUE(s.engine().step().ok());
  EXPECT_EQ(s.out.logprobs.count(2), 0u) << "request 2 did not ask";
  EXPECT_TRUE(s.out.finished[2].logprobs.empty());
  for (int64_t id : {0, 1}) {
    const RequestResult& r = s.out.finished[id];
    const size_t k = id == 0 ? 4 : 0;
    ASSERT_EQ(r.tokens.size(), 5u);
    ASSERT_EQ(r.logprobs.size(), 5u);
    ASSERT_EQ(s.out.logprobs[id].size(), 5u);
    ASSERT_EQ(r.logits.size(), 5u * static_cast<size_t>(vocab));
    for (size_t step = 0; step < 5; ++step) {
      const float* row = r.logits.data() + step * static_cast<size_t>(vocab);
      double m = row[0];
      for (int64_t v = 1; v < vocab; ++v) m = std::max(m, static_cast<double>(row[v]));
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - m);
      const double lse = m + std::log(sum);
      const TokenLogprobs& lp = r.logprobs[step];
      EXPECT_EQ(lp.sampled.token, r.tokens[step]);
      EXPECT_NEAR(lp.sampled.logprob, row[r.tokens[step]] - lse, 1e-9) << "request " << id << " step " << step;
      ASSERT_EQ(lp.top.size(), k);
      for (size_t i = 0; i < k; ++i) {
        EXPECT_NEAR(lp.top[i].logprob, row[lp.top[i].token] - lse, 1e-9);
        // Sorted, and nothing outside the list beats its last entry (ties to the lower id).
        if (i > 0) {
          EXPECT_TRUE(row[lp.top[i - 1].token] > row[lp.top[i].token] ||
                      (row[lp.top[i - 1].token] == row[lp.top[i].token] && lp.top[i - 1].token < lp.top[i].token));
        }
      }
      if (k > 0) {
        const TokenLogprob last = lp.top.back();
        for (int64_t v = 0; v < vocab; ++v) {
          const bool listed =
              std::any_of(lp.top.begin(), lp.top.end(), [&](const TokenLogprob& t) { return t.token == v; });
          if (!listed) {
            EXPECT_TRUE(row[v] < row[last.token] || (row[v] == row[last.token] && v > last.token)) << "token " << v;
          }
        }
      }
      const TokenLogprobs& heard = s.out.logprobs[id][step];
      EXPECT_EQ(heard.sampled.token, lp.sampled.token);
      EXPECT_EQ(heard.sampled.logprob, lp.sampled.logprob);
      EXPECT_EQ(heard.top.size(), lp.top.size());
    }
    if (id == 1) {  // greedy: the sampled token is the most likely one
      for (const auto& lp : r.logprobs) EXPECT_GE(lp.sampled.logprob, std::log(1.0 / static_cast<double>(vocab)));
    }
  }
}

TEST(EngineStreaming, logprobs_out_of_range_are_refused_at_submit) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  StreamingEngine s(8);
  for (int bad : {-2, 21}) {
    Request r = request_of(0, 3, 2, vocab);
    r.logprobs = bad;
    const Status st = s.engine().submit(std::move(r));
    EXPECT_EQ(st.message(), fmt::format("request 0: logprobs is {} but must be -1 (none) or 0..20", bad));
  }
}

// SchedulingPolicy::kPriority: with one sequence at a time, waiting requests start (and so finish) lowest
// priority first, equal priorities in arrival order, a request submitted while others run included; each gives
// the tokens it gives alone. kFcfs refuses a priority other than 0 with the reason, queueing nothing.
TEST(EngineStreaming, priority_policy_starts_the_lowest_priority_first_and_fcfs_refuses_a_priority) {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  StreamingEngine fcfs(64, 1);
  Request r = harness::request_of(7, 4, 3, vocab);
  r.priority = -2;
  const Status refused = fcfs.engine().submit(r);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(),
            "request 7: priority is -2 but requests start in arrival order (scheduling policy fcfs)");
  EXPECT_FALSE(fcfs.engine().has_work());

  StreamingEngine se(64, 1, false, SchedulingPolicy::kPriority);
  const int32_t priorities[] = {0, 5, -1, 5, 0, -3};
  for (int64_t id = 0; id < 5; ++id) {
    Request q = harness::request_of(id, 4, 3, vocab);
    q.priority = priorities[id];
    ASSERT_TRUE(se.engine().submit(q).ok());
  }
  ASSERT_TRUE(se.engine().step().ok());  // request 2 (priority -1) starts
  Request late = harness::request_of(5, 4, 3, vocab);
  late.priority = priorities[5];
  ASSERT_TRUE(se.engine().submit(late).ok());
  while (se.engine().has_work()) ASSERT_TRUE(se.engine().step().ok());
  EXPECT_EQ(se.out.finish_order, (std::vector<int64_t>{2, 5, 0, 4, 1, 3}));
  for (int64_t id = 0; id < 6; ++id) {
    StreamingEngine alone(64, 1);
    ASSERT_TRUE(alone.engine().submit(harness::request_of(id, 4, 3, vocab)).ok());
    while (alone.engine().has_work()) ASSERT_TRUE(alone.engine().step().ok());
    EXPECT_EQ(se.out.tokens[id], alone.out.tokens[id]) << "request " << id;
  }
}

}  // namespace
}  // namespace genbridge::engine
