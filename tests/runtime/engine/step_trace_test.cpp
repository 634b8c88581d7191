// The monolithic engine's trace (`genbridge run --trace`): every phase of every forward as a span in the
// Chrome/Perfetto format of the AFD traces; tracing changes no result.

#include "runtime/engine/step_trace.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "runtime/engine/engine.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::engine {
namespace {

struct EngineRun {
  std::vector<RequestResult> results;
  int64_t forwards = 0;
};

// Two requests of different lengths on the tiny synthetic model; traced when `trace` is set.
EngineRun run_engine(const model::Checkpoint& ckpt, const runtime::DeviceOperator& dev, StepTrace* trace) {
  const model::ModelConfig& c = ckpt.config();
  auto pool =
      runtime::KvPagePool::create(dev.kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 8);
  EXPECT_TRUE(pool.ok());
  auto runner = model::ModelRunner::create(ckpt, dev, *pool);
  EXPECT_TRUE(runner.ok());
  LocalExecutor ex(**runner);
  ex.set_trace(trace);
  Engine eng(ex, *pool, {.record_logits = true});
  EXPECT_TRUE(eng.submit({.id = 0, .prompt = {1, 2, 3, 4}, .max_new_tokens = 3}).ok());
  EXPECT_TRUE(eng.submit({.id = 1, .prompt = {5, 6}, .max_new_tokens = 4}).ok());
  EXPECT_TRUE(eng.run_to_completion().ok());
  // One prefill forward, then one decode forward per token after the first of the longest request.
  return {eng.results(), 1 + 3};
}

TEST(StepTrace, every_phase_of_every_forward_is_a_span_and_results_are_unchanged) {
  testing::TempDir dir;
  ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 5, dir / "m").ok());
  auto ckpt = model::Checkpoint::open(dir / "m");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().to_string();
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  const model::ModelConfig& c = ckpt->config();

  StepTrace trace;
  const EngineRun traced = run_engine(*ckpt, *dev, &trace);
  const EngineRun plain = run_engine(*ckpt, *dev, nullptr);
  ASSERT_EQ(traced.results.size(), plain.results.size());
  for (size_t r = 0; r < plain.results.size(); ++r) {
    EXPECT_EQ(traced.results[r].tokens, plain.results[r].tokens);
    EXPECT_EQ(traced.results[r].logits, plain.results[r].logits);
  }

  const std::string path = (dir / "trace.json").string();
  ASSERT_TRUE(trace.write(path).ok());
  std::ifstream in(path);
  const nlohmann::json t = nlohmann::json::parse(in);  // valid JSON
  std::map<std::string, int64_t> spans;
  std::map<std::string, int> rows;
  int64_t max_step = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") rows[e["args"]["name"]] = e["tid"];
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    EXPECT_GE(e["ts"].get<double>(), 0.0);
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    const std::string cat = e["cat"];
    ++spans[cat];
    EXPECT_EQ(e["tid"], rows.at(cat)) << "one row per phase";
    max_step = std::max<int64_t>(max_step, e["args"]["step"].get<int64_t>());
  }
  const int64_t steps = traced.forwards, moe = c.num_moe_layers();
  EXPECT_EQ(max_step, steps);
  EXPECT_EQ(spans["embed"], steps);
  EXPECT_EQ(spans["attention"], steps * c.num_hidden_layers);
  EXPECT_EQ(spans["route"], steps * moe);
  EXPECT_EQ(spans["experts"], steps * moe);
  EXPECT_EQ(spans["combine"], steps * moe);
  EXPECT_EQ(spans["logits"], steps);
  EXPECT_EQ(trace.dropped(), 0);
}

TEST(StepTrace, spans_beyond_the_reserved_capacity_are_counted_as_dropped) {
  StepTrace trace(2);
  for (int i = 0; i < 5; ++i) trace.add(model::ForwardPhase::kAttention, 0, 1, 10 * i, 10 * i + 5);
  EXPECT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace.dropped(), 3);
  const nlohmann::json t = nlohmann::json::parse(trace.json());
  EXPECT_EQ(t["traceEvents"].back()["name"], "attention L0");
}

TEST(StepTrace, unwritable_path_is_an_error_naming_it) {
  const StepTrace trace(1);
  const Status s = trace.write("/nonexistent-dir/trace.json");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.message().starts_with("--trace /nonexistent-dir/trace.json: ")) << s.message();
}

}  // namespace
}  // namespace genbridge::engine
