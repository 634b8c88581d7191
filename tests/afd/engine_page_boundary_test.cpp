// The real engine on AFD topologies (in-process transport) with generations that cross 1, 2 and 3 KV pages
// (128 tokens each) at different steps, in bf16 and in the build's quantized KV representation: tokens and
// logits equal the monolithic engine's bit for bit, and every page is returned.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <ostream>
#include <string>

#include "afd/engine_job.h"
#include "afd/support/engine_job_case.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::afd {
namespace {

constexpr int64_t kPagesPerRank = 16;

const model::Checkpoint& checkpoint() {
  static testing::TempDir dir;
  static std::unique_ptr<model::Checkpoint> ck = [] {
    EXPECT_TRUE(model::write_synthetic_checkpoint("tiny", 3, dir / "m").ok());
    return std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(dir / "m")).value());
  }();
  return *ck;
}

const runtime::DeviceOperator& device(const std::string& kv) {
  static std::map<std::string, std::unique_ptr<runtime::DeviceOperator>> devs;
  auto& d = devs[kv];
  if (!d) {
    d = std::make_unique<runtime::DeviceOperator>(
        std::move(runtime::DeviceOperator::create({.kv_cache_dtype = kv})).value());
  }
  return *d;
}

// Final lengths (prompt + generated tokens fed back) 139, 279, 394 and 130: one, two, three and one page
// boundaries crossed, at different steps; request 4's prompt fills exactly one page. With A attention
// ranks, request r runs on rank r % A.
std::vector<engine::Request> requests() {
  const int64_t vocab = checkpoint().config().vocab_size;
  const std::vector<std::pair<int, int>> shapes = {{120, 20}, {60, 220}, {5, 390}, {128, 3}};
  std::vector<engine::Request> reqs;
  for (size_t r = 0; r < shapes.size(); ++r) {
    engine::Request q;
    q.id = static_cast<int64_t>(r);
    for (int i = 0; i < shapes[r].first; ++i) {
      q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(500 + r, i) * static_cast<double>(vocab)));
    }
    q.max_new_tokens = shapes[r].second;
    reqs.push_back(q);
  }
  return reqs;
}

std::vector<engine::RequestResult> monolithic(const std::string& kv) {
  const model::ModelConfig& c = checkpoint().config();
  const runtime::DeviceOperator& dev = device(kv);
  auto pool = runtime::KvPagePool::create(
      dev.kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), kPagesPerRank);
  auto runner = model::ModelRunner::create(checkpoint(), dev, *pool);
  engine::LocalExecutor ex(**runner);
  engine::Engine eng(ex, *pool, {.record_logits = true});
  for (auto& r : requests()) EXPECT_TRUE(eng.submit(r).ok());
  const Status st = eng.run_to_completion();
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(pool->used_pages(), 0);
  return eng.results();
}

struct Case {
  ConnectorKind connector;
  int a, f, s;
  std::string kv;
};

std::string case_name(const Case& k) {
  return fmt::format("{}_{}A{}F_S{}_{}", connector_kind_name(k.connector), k.a, k.f, k.s, k.kv);
}
// Keeps the ctest names stable (gtest would print the parameter's bytes, pointers included).
void PrintTo(const Case& k, std::ostream* os) { *os << case_name(k); }

class EngineAfdPages : public ::testing::TestWithParam<Case> {};

TEST_P(EngineAfdPages, tokens_and_logits_equal_the_monolithic_engine) {
  const Case k = GetParam();
  EngineJobOptions o = engine_job_case(k.connector, k.a, k.f, k.s);
  auto job = run_inproc_engine_job(checkpoint(), device(k.kv), requests(), kPagesPerRank, o);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  const auto mono = monolithic(k.kv);
  const auto reqs = requests();
  ASSERT_EQ(job->results.size(), mono.size());
  for (size_t r = 0; r < mono.size(); ++r) {
    EXPECT_EQ(static_cast<int64_t>(mono[r].tokens.size()), reqs[r].max_new_tokens) << "request " << r;
    EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << "request " << r;
    EXPECT_EQ(job->results[r].logits, mono[r].logits) << "request " << r;
  }
}

std::vector<Case> matrix() {
  std::vector<Case> out;
  for (const std::string kv : {"bf16", "quantized"}) {
    out.push_back({ConnectorKind::kSync, 1, 1, 1, kv});
    out.push_back({ConnectorKind::kSync, 2, 1, 2, kv});
    out.push_back({ConnectorKind::kAsync, 1, 1, 2, kv});
    out.push_back({ConnectorKind::kAsync, 2, 2, 1, kv});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(matrix, EngineAfdPages, ::testing::ValuesIn(matrix()),
                         [](const auto& info) { return case_name(info.param); });

}  // namespace
}  // namespace genbridge::afd
