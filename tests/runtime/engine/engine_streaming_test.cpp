// The engine's streaming use (a server): a listener receives every token in order and every finished
// request once; cancel() ends a waiting or running request and frees its KV pages; step() by step()
// gives the same tokens as run_to_completion.
#include <gtest/gtest.h>

#include <map>

#include "engine_harness.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;

struct Streamed {
  std::map<int64_t, std::vector<int32_t>> tokens;  // from on_token
  std::map<int64_t, RequestResult> finished;       // from on_finish
};

class StreamingEngine {
 public:
  explicit StreamingEngine(int64_t pool_pages, int64_t max_batch = 8) {
    const model::ModelConfig& c = checkpoint("tiny").config();
    dev_ = std::make_unique<runtime::DeviceOperator>(runtime::DeviceOperator::create({}).value());
    pool_ = std::make_unique<runtime::KvPagePool>(
        runtime::KvPagePool::create(dev_->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}),
                                    pool_pages)
            .value());
    runner_ = model::ModelRunner::create(checkpoint("tiny"), *dev_, *pool_).value();
    executor_ = std::make_unique<LocalExecutor>(*runner_);
    engine_ = std::make_unique<Engine>(*executor_, *pool_, EngineOptions{.max_batch = max_batch});
    engine_->set_listener({.on_token = [this](int64_t id, int32_t t) { out.tokens[id].push_back(t); },
                           .on_finish =
                               [this](RequestResult&& r) {
                                 EXPECT_EQ(out.finished.count(r.id), 0u) << "request " << r.id << " finished twice";
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

}  // namespace
}  // namespace genbridge::engine
