// The real engine on every AFD topology of the matrix (connector x A:F x stages, in-process transport)
// gives the monolithic engine's tokens and logits bit for bit, on a synthetic checkpoint with a dense
// layer and a shared expert. (The same matrix over MPI runs the stand-in model under mpirun.)
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "afd/engine_job.h"

#include <fmt/format.h>
#include "runtime/model/synthetic.h"
#include "support/temp_dir.h"

namespace genbridge::afd {
namespace {

struct Fixture {
  testing::TempDir dir;
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
  Fixture() {
    EXPECT_TRUE(model::write_synthetic_checkpoint("tiny", 3, dir / "m").ok());
    ckpt = std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(dir / "m")).value());
    dev = std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create({})).value());
  }
};
Fixture& fixture() {
  static Fixture f;
  return f;
}

std::vector<engine::Request> requests(int64_t vocab) {
  std::vector<engine::Request> reqs;
  for (int r = 0; r < 5; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < 4 + 3 * r; ++i) q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(77 + r, i) * vocab));
    q.max_new_tokens = 3 + r % 3;  // ranks finish at different steps
    reqs.push_back(q);
  }
  return reqs;
}

const std::vector<engine::RequestResult>& monolithic() {
  static std::vector<engine::RequestResult> res = [] {
    Fixture& f = fixture();
    const model::ModelConfig& c = f.ckpt->config();
    auto pool = runtime::KvPagePool::create(
        f.dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 16);
    auto runner = model::ModelRunner::create(*f.ckpt, *f.dev, *pool);
    engine::LocalExecutor ex(**runner);
    engine::Engine eng(ex, *pool, {.record_logits = true});
    for (auto& r : requests(c.vocab_size)) EXPECT_TRUE(eng.submit(r).ok());
    EXPECT_TRUE(eng.run_to_completion().ok());
    return eng.results();
  }();
  return res;
}

struct Case {
  ConnectorKind connector;
  int a, f, s;
};

class EngineAfd : public ::testing::TestWithParam<Case> {};

TEST_P(EngineAfd, tokens_and_logits_equal_the_monolithic_engine) {
  const Case k = GetParam();
  Fixture& f = fixture();
  EngineJobOptions o;
  o.afd.num_attention = k.a;
  o.afd.num_ffn = k.f;
  o.afd.num_stages = k.s;
  o.afd.connector = k.connector;
  o.afd.async_dp = k.connector == ConnectorKind::kAsync;
  o.afd.timeout_ms = 20000;
  o.engine.record_logits = true;
  auto job = run_inproc_engine_job(*f.ckpt, *f.dev, requests(f.ckpt->config().vocab_size), 16, o);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  const auto& mono = monolithic();
  ASSERT_EQ(job->results.size(), mono.size());
  for (size_t r = 0; r < mono.size(); ++r) {
    EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << "request " << r;
    EXPECT_EQ(job->results[r].logits, mono[r].logits) << "request " << r;
  }
  EXPECT_GT(job->report.decode_tokens, 0);
  EXPECT_EQ(job->num_ranks, k.a + k.f);
}

std::vector<Case> matrix() {
  std::vector<Case> out;
  for (ConnectorKind c : {ConnectorKind::kSync, ConnectorKind::kAsync})
    for (auto [a, f] : {std::pair{1, 1}, {2, 1}, {2, 2}})
      for (int s : {1, 2}) out.push_back({c, a, f, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(matrix, EngineAfd, ::testing::ValuesIn(matrix()), [](const auto& info) {
  const Case& k = info.param;
  return fmt::format("{}_{}A{}F_S{}", connector_kind_name(k.connector), k.a, k.f, k.s);
});

TEST(EngineAfd, failing_attention_rank_ends_the_whole_job) {
  Fixture& f = fixture();
  // Attention rank 0 fails at start-up (a malformed request): the other attention rank and both FFN ranks
  // must stop (no hang) and the job's error must name the failed rank and its reason.
  EngineJobOptions o;
  o.afd.num_attention = 2;
  o.afd.num_ffn = 2;
  o.afd.timeout_ms = 5000;
  auto reqs = requests(f.ckpt->config().vocab_size);
  reqs[0].prompt.push_back(-1);  // never reaches the FFN: rejected at submit on its attention rank
  auto job = run_inproc_engine_job(*f.ckpt, *f.dev, reqs, 16, o);
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("request 0: prompt token -1 is outside the vocabulary"), std::string::npos)
      << job.status().to_string();
}

}  // namespace
}  // namespace genbridge::afd
