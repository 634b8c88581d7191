// The DeepSeek-V3.2 model (MLA + DSA, grouped routing, shared experts, a dense first layer) under AFD, in
// process: sync and async connectors, 1:1 and 2:2 attention:FFN ranks, 1 and 2 stages give the monolithic
// engine's tokens and logits bit for bit, with prompts longer than index_topk so that sparse selection is
// active. (The MPI transport runs the same engine job code under mpirun with the Qwen model.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>

#include "afd/engine_job.h"
#include "runtime/forward/deepseek_attention.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::afd {
namespace {

struct Fixture {
  testing::TempDir dir;
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
  Fixture() {
    EXPECT_TRUE(model::write_synthetic_checkpoint("tiny-dsa", 3, dir / "m").ok());
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
  for (int r = 0; r < 3; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < 60 + 5 * r; ++i)  // index_topk is 64: decode steps select
      q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(91 + r, i) * vocab));
    q.max_new_tokens = 6 + r;
    reqs.push_back(q);
  }
  return reqs;
}

const std::vector<engine::RequestResult>& monolithic() {
  static std::vector<engine::RequestResult> res = [] {
    Fixture& f = fixture();
    const model::ModelConfig& c = f.ckpt->config();
    auto pool = runtime::KvPagePool::create(f.dev->kv_page_geometry(model::kv_model_shape(c)), 16);
    auto runner = model::ModelRunner::create(*f.ckpt, *f.dev, *pool);
    EXPECT_TRUE(runner.ok()) << runner.status().to_string();
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

class EngineDsaAfd : public ::testing::TestWithParam<Case> {};

TEST_P(EngineDsaAfd, tokens_and_logits_equal_the_monolithic_engine) {
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
    EXPECT_FALSE(mono[r].tokens.empty());
    EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << "request " << r;
    EXPECT_EQ(job->results[r].logits, mono[r].logits) << "request " << r;
  }
  EXPECT_EQ(job->num_ranks, k.a + k.f);
}

std::vector<Case> matrix() {
  std::vector<Case> out;
  for (ConnectorKind c : {ConnectorKind::kSync, ConnectorKind::kAsync})
    for (auto [a, f] : {std::pair{1, 1}, {2, 2}})
      for (int s : {1, 2}) out.push_back({c, a, f, s});
  return out;
}

INSTANTIATE_TEST_SUITE_P(matrix, EngineDsaAfd, ::testing::ValuesIn(matrix()), [](const auto& info) {
  const Case& k = info.param;
  return fmt::format("{}_{}A{}F_S{}", connector_kind_name(k.connector), k.a, k.f, k.s);
});

}  // namespace
}  // namespace genbridge::afd
