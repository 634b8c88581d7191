// The one engine assembly: its engine gives the tokens and logits of an engine built by hand, a custom
// executor is the one the engine runs, the pool is sized for a server's whole contexts (capped at half of
// this machine's memory), and the weight-quantization decision.
#include "runtime/engine/assembly.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine_harness.h"

namespace genbridge::engine {
namespace {

// 2 layers x 2 kv heads x (K + V) x 256 bytes = 2048 bytes per token, 256 KiB per page of 128 tokens.
runtime::KvPageGeometry small_pages() {
  return {.num_layers = 2, .num_kv_heads = 2, .page_size = 128, .row_bytes = 256};
}

std::vector<Request> requests(int n, int64_t vocab) {
  std::vector<Request> reqs;
  for (int r = 0; r < n; ++r) reqs.push_back(harness::request_of(r, 5 + 3 * r, 6, vocab));
  return reqs;
}

TEST(Assembly, equals_an_engine_built_by_hand) {
  const model::Checkpoint& ck = harness::checkpoint("tiny");
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  const AssemblyOptions options{.engine = {.max_batch = 2, .record_logits = true}};
  const std::vector<Request> reqs = requests(3, ck.config().vocab_size);
  auto plan = plan_kv_pool(options.kv_pool, *dev, ck.config(), reqs);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  auto job = assemble_engine(ck, *dev, plan->pages, options);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  EXPECT_EQ((*job)->pool.num_pages(), plan->pages);
  for (const Request& r : reqs) ASSERT_TRUE((*job)->engine->submit(r).ok());
  ASSERT_TRUE((*job)->engine->run_to_completion().ok());
  const std::vector<RequestResult> want = harness::run_engine_on(ck, {.max_batch = 2, .pool_pages = plan->pages}, reqs);
  const std::vector<RequestResult>& got = (*job)->engine->results();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].logits, want[i].logits) << "request " << i;
  }
  EXPECT_EQ((*job)->pool.used_pages(), 0);
}

// Counts the forwards of the executor it wraps.
class CountingExecutor final : public ForwardExecutor {
 public:
  explicit CountingExecutor(const model::ModelRunner& runner, int* forwards) : inner_(runner), forwards_(forwards) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  Status forward(const model::ForwardInput& input, std::span<float> logits) override {
    ++*forwards_;
    return inner_.forward(input, logits);
  }
  std::span<const model::ActivationFault> faults() const override { return inner_.faults(); }
  void set_choice_sink(const model::ChoiceSink* sink) override { inner_.set_choice_sink(sink); }

 private:
  LocalExecutor inner_;
  int* forwards_;
};

TEST(Assembly, runs_the_executor_the_factory_builds) {
  const model::Checkpoint& ck = harness::checkpoint("tiny");
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  int forwards = 0;
  const ExecutorFactory factory = [&](const model::ModelRunner& runner) {
    return Result<std::unique_ptr<ForwardExecutor>>(std::make_unique<CountingExecutor>(runner, &forwards));
  };
  auto job = assemble_engine(ck, *dev, 16, {.engine = {.max_batch = 4}}, factory);
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  ASSERT_TRUE((*job)->engine->submit(harness::request_of(0, 4, 3, ck.config().vocab_size)).ok());
  ASSERT_TRUE((*job)->engine->run_to_completion().ok());
  EXPECT_EQ(forwards, 3);  // the prefill and two decode steps

  const ExecutorFactory refusing = [](const model::ModelRunner&) -> Result<std::unique_ptr<ForwardExecutor>> {
    return unavailable("no executor here");
  };
  EXPECT_EQ(assemble_engine(ck, *dev, 16, {}, refusing).status().message(), "no executor here");
}

TEST(Assembly, more_pages_than_a_pool_holds_are_refused) {
  const model::Checkpoint& ck = harness::checkpoint("tiny");
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  EXPECT_FALSE(assemble_engine(ck, *dev, int64_t{1} << 31, {}).ok());  // beyond what a pool holds
}

TEST(KvPoolPlan, a_server_gets_room_for_its_whole_contexts) {
  const KvPoolOptions o{.pools_in_process = 2, .whole_context_seqs = 4};
  // 300 tokens: 3 pages of 128 per sequence, 4 sequences.
  auto plan = plan_kv_pool(o, small_pages(), {}, 300);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->pages, 12);
  EXPECT_EQ(plan->memory_mb, 0);
  EXPECT_TRUE(plan->note.empty());
  // A budget wins over the whole contexts.
  auto budget = plan_kv_pool({.memory_mb = 1, .whole_context_seqs = 4}, small_pages(), {}, 300);
  ASSERT_TRUE(budget.ok());
  EXPECT_EQ(budget->pages, 4);  // 1 MiB / 256 KiB
}

TEST(KvPoolPlan, whole_contexts_beyond_half_the_memory_are_capped) {
  const int64_t phys = physical_memory_bytes();
  // 128 KiB per token, 2^20 tokens per sequence: 128 GiB each, 512 GiB for 4 over 2 pools: 1 TiB.
  const runtime::KvPageGeometry big{.num_layers = 8, .num_kv_heads = 8, .page_size = 128, .row_bytes = 1024};
  if (phys <= 0 || phys >= (int64_t{1} << 40)) GTEST_SKIP() << "this machine holds the whole contexts";
  auto plan = plan_kv_pool({.pools_in_process = 2, .whole_context_seqs = 4}, big, {}, int64_t{1} << 20);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->memory_mb, std::max<int64_t>(1, (phys / 2 / 2) >> 20));
  EXPECT_EQ(plan->pages, (plan->memory_mb << 20) / big.bytes_per_page());
  EXPECT_EQ(plan->note,
            "KV pool: room for --max-batch 4 sequences of the whole context (1048576 tokens) would take "
            "1048576 MiB in all, more than half of this machine's memory; using " +
                std::to_string(plan->memory_mb) +
                " MiB per attention rank (2) (requests wait for pages; set --kv-memory-mb to choose)");
}

TEST(WeightQuantTiming, decided_by_the_device_and_the_job) {
  auto bf16 = runtime::DeviceOperator::create({});
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(weight_quant_timing(*bf16, false), WeightQuantTiming::kNone);
  EXPECT_EQ(weight_quant_timing(*bf16, true), WeightQuantTiming::kNone);
  runtime::DeviceConfig config;
  config.weight_quant = "auto";
  auto quant = runtime::DeviceOperator::create(config);
  ASSERT_TRUE(quant.ok()) << quant.status().to_string();
  ASSERT_NE(quant->weight_quant(), nullptr);
  EXPECT_EQ(weight_quant_timing(*quant, false), WeightQuantTiming::kAtLoad);
  EXPECT_EQ(weight_quant_timing(*quant, true), WeightQuantTiming::kRankShare);
}

}  // namespace
}  // namespace genbridge::engine
