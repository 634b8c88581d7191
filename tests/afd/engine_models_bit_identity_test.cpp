// The model families beyond Qwen3-MoE under AFD, in process: sync and async connectors, 1:1, 2:1 and 2:2
// attention:FFN ranks, 1 and 2 stages give the monolithic engine's tokens and logits bit for bit.
// - DeepSeek-V3.2 (`tiny-dsa`: MLA + DSA, grouped routing, shared experts, a dense first layer), with prompts
//   longer than index_topk (64) so that sparse selection is active;
// - Qwen3.5-MoE (`tiny-qwen35`: Gated DeltaNet + gated attention, Gemma norms, gated shared expert), whose
//   attention ranks own both the KV pages and the per-sequence state slots, with prompts longer than a KV
//   page (128 tokens) and than the gated delta rule's chunk (kGatedDeltaRuleChunk, 64);
// - DeepSeek-V4 (`tiny-dsv4`: shared K = V attention over sliding windows and compressed entries, the indexer,
//   hyper-connections, hash and sqrt-softplus routing, the SwiGLU clamp), whose attention ranks own the window
//   rings and compressors' state (state slots) and the compressed entries (pages) and route (hash routing reads
//   the token ids there), with prompts past a ratio-128 window and the indexer's top-16 of ratio-4 windows.
// Each case also runs with --moe-dispatch quantized (the generation's quantized rows travel; the monolithic engine
// quantizes at the same point). (The MPI transport runs the same engine job code under mpirun: afd.mpi.engine.*.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "afd/engine_job.h"
#include "afd/support/engine_job_case.h"
#include "runtime/engine/assembly.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::afd {
namespace {

constexpr int64_t kPages = 16;
constexpr int64_t kMaxBatch = 4;  // fewer than the requests: the state slots are reused as sequences finish

struct Model {
  testing::TempDir dir;
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
  std::vector<engine::RequestResult> monolithic;
};

std::vector<engine::Request> requests(int64_t vocab) {
  std::vector<engine::Request> reqs;
  for (int r = 0; r < 5; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < 60 + 20 * r; ++i)  // 60..140: past index_topk, the chunk and a page
      q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(91 + r, i) * static_cast<double>(vocab)));
    q.max_new_tokens = 6 + r;
    reqs.push_back(q);
  }
  return reqs;
}

engine::EngineOptions engine_options() { return {.max_batch = kMaxBatch, .record_logits = true}; }

Model& model(const std::string& preset, bool quantized_dispatch) {
  static std::map<std::pair<std::string, bool>, std::unique_ptr<Model>> models;
  std::unique_ptr<Model>& m = models[{preset, quantized_dispatch}];
  if (m) return *m;
  m = std::make_unique<Model>();
  EXPECT_TRUE(model::write_synthetic_checkpoint(preset, 3, m->dir / "m").ok());
  m->ckpt = std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(m->dir / "m")).value());
  runtime::DeviceConfig dc;
  dc.moe_dispatch = quantized_dispatch ? "quantized" : "bf16";
  m->dev = std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create(dc)).value());
  auto assembled = engine::assemble_engine(*m->ckpt, *m->dev, kPages,
                                           {.engine = engine_options(), .kv_pool = {.state_slots = kMaxBatch}}, {});
  EXPECT_TRUE(assembled.ok()) << assembled.status().to_string();
  engine::Engine& eng = *(*assembled)->engine;
  for (auto& r : requests(m->ckpt->config().vocab_size)) EXPECT_TRUE(eng.submit(r).ok());
  EXPECT_TRUE(eng.run_to_completion().ok());
  m->monolithic = eng.results();
  return *m;
}

struct Case {
  std::string preset;
  ConnectorKind connector;
  int a, f, s;
  bool quantized_dispatch = false;
};

class EngineModelsAfd : public ::testing::TestWithParam<Case> {};

TEST_P(EngineModelsAfd, tokens_and_logits_equal_the_monolithic_engine) {
  const Case k = GetParam();
  Model& m = model(k.preset, k.quantized_dispatch);
  EngineJobOptions o = engine_job_case(k.connector, k.a, k.f, k.s);
  o.engine = engine_options();
  auto job = run_inproc_engine_job(*m.ckpt, *m.dev, requests(m.ckpt->config().vocab_size), kPages, o);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  ASSERT_EQ(job->results.size(), m.monolithic.size());
  for (size_t r = 0; r < m.monolithic.size(); ++r) {
    EXPECT_FALSE(m.monolithic[r].tokens.empty());
    EXPECT_EQ(job->results[r].tokens, m.monolithic[r].tokens) << "request " << r;
    EXPECT_EQ(job->results[r].logits, m.monolithic[r].logits) << "request " << r;
  }
  EXPECT_EQ(job->num_ranks, k.a + k.f);
}

std::vector<Case> matrix() {
  std::vector<Case> out;
  for (const char* preset : {"tiny-dsa", "tiny-qwen35", "tiny-dsv4"})
    for (bool q : {false, true})
      for (ConnectorKind c : {ConnectorKind::kSync, ConnectorKind::kAsync})
        for (auto [a, f] : {std::pair{1, 1}, {2, 1}, {2, 2}})
          for (int s : {1, 2}) out.push_back({preset, c, a, f, s, q});
  return out;
}

// Every model family accepts the quantized dispatch, and it is in force: the logits differ from the bf16
// dispatch's.
TEST(EngineModelsAfd, quantized_dispatch_changes_the_routed_experts_input_of_every_model) {
  for (const char* preset : {"tiny-dsa", "tiny-qwen35", "tiny-dsv4"}) {
    EXPECT_NE(model(preset, true).monolithic[0].logits, model(preset, false).monolithic[0].logits) << preset;
  }
}

INSTANTIATE_TEST_SUITE_P(matrix, EngineModelsAfd, ::testing::ValuesIn(matrix()), [](const auto& info) {
  const Case& k = info.param;
  std::string model = k.preset;
  for (char& ch : model) ch = ch == '-' ? '_' : ch;
  return fmt::format("{}_{}_{}A{}F_S{}{}", model, connector_kind_name(k.connector), k.a, k.f, k.s,
                     k.quantized_dispatch ? "_quantized_dispatch" : "");
});

}  // namespace
}  // namespace genbridge::afd
