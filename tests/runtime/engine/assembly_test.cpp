// The one engine assembly: its engine gives the tokens and logits of an engine built by hand, a custom
// executor is the one the engine runs, the pool is sized for a server's whole contexts (capped at half of
// this machine's memory), and the weight-quantization decision.
#include "runtime/engine/assembly.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine_harness.h"
#include "runtime/forward/deepseek_attention.h"
#include "tools/make_model/synthetic.h"

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

// What the pool of a model with per-sequence state holds, said once: DeepSeek-V4's state slots (sliding-window
// rings and compressors) and its compressed rows in the pages, in the start-up line and the sizing refusals. bf16
// rows (kv_cache_dtype auto), the same on both generations.
TEST(KvPoolPlan, deepseek_v4_pool_line_names_its_state_slots_and_compressed_rows) {
  const model::ModelConfig c = model::synthetic_preset_config("tiny-dsv4").value();
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  const runtime::KvPageGeometry g = dev->kv_page_geometry(model::kv_model_shape(c));
  EXPECT_EQ(g.state.contents, "sliding-window rings and compressor state");
  // Per slot: 4 rings of 128 x 1024 B, the compressors' fp32 rows (ratio 4: 8 x 2048 x 4 B each, ratio 128:
  // 128 x 1024 x 4 B) and the indexer compressors' (8 x 512 x 4 B each). Per page: 32 compressed rows (+ 32
  // indexer keys of 256 B) in each ratio-4 layer, 1 row in the ratio-128 layer.
  EXPECT_EQ(g.state.bytes_per_slot(), 4 * 128 * 1024 + 2 * 8 * 2048 * 4 + 128 * 1024 * 4 + 2 * 8 * 512 * 4);
  EXPECT_EQ(g.bytes_per_page(), 2 * 32 * (1024 + 256) + 1024);
  auto plan = plan_kv_pool({.memory_mb = 16, .state_slots = 4}, *dev, c, {});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->pages, ((int64_t{16} << 20) - 4 * g.state.bytes_per_slot()) / g.bytes_per_page());
  EXPECT_EQ(describe_kv_pool(*plan, *dev, c, /*per_attention_rank=*/false),
            "KV pool: 143 pages of 128 tokens (11.3 MiB) + 4 state slots, one per running sequence (4.6 MiB); KV "
            "representation: sliding-window rings and compressor state: the last 128 shared K = V rows of each of "
            "the 4 layers (bf16 latent+rope, 1024 B per row), the unfinished windows of 3 compressors and 2 indexer "
            "compressors (fp32 [kv | gate] rows); 1.16 MiB per sequence; KV pages: the compressed rows of 3 layers "
            "in the same representation (one per 4 tokens in 2, per 128 tokens in 1) + indexer keys bf16 (256 B per "
            "row) of 2: 648 bytes per token (4 layers)");
  EXPECT_EQ(plan_kv_pool({.memory_mb = 1, .state_slots = 64}, *dev, c, {}).status().message(),
            "--kv-memory-mb 1: the state pool alone takes 74 MiB (--max-batch 64 sequences x 1.16 MiB of "
            "sliding-window rings and compressor state each), leaving no room for KV pages; give at least 75 or "
            "lower --max-batch");
  EXPECT_EQ(plan_kv_pool({.state_slots = 0}, *dev, c, {}).status().message(),
            "kv pool sizing: the model keeps sliding-window rings and compressor state per sequence, so the pool "
            "needs between 1 and 1048576 state slots (--max-batch), not 0");
  // Every layer on its sliding window alone: rings only, nothing in the pages.
  model::ModelConfig window_only = c;
  std::fill(window_only.dsv4.compress_ratios.begin(), window_only.dsv4.compress_ratios.end(), 0);
  const runtime::KvModelShape shape = model::kv_model_shape(window_only);
  EXPECT_EQ(dev->kv_page_geometry(shape).state.contents, "sliding-window rings");
  EXPECT_EQ(describe_kv_representation(*dev, window_only, 0),
            "sliding-window rings: the last 128 shared K = V rows of each of the 4 layers (bf16 latent+rope, 1024 B "
            "per row); 0.50 MiB per sequence; KV pages: none (every layer attends to its sliding window only)");
}

TEST(KvPoolPlan, qwen35_pool_line_names_its_linear_attention_state) {
  const model::ModelConfig c = model::synthetic_preset_config("tiny-qwen35").value();
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  const runtime::KvPageGeometry g = dev->kv_page_geometry(model::kv_model_shape(c));
  EXPECT_EQ(g.state.contents, "linear-attention state");
  auto plan = plan_kv_pool({.memory_mb = 64, .state_slots = 2}, *dev, c, {});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const std::string line = describe_kv_pool(*plan, *dev, c, /*per_attention_rank=*/true);
  EXPECT_TRUE(line.starts_with("KV pool per attention rank: ")) << line;
  EXPECT_NE(line.find(" + 2 state slots, one per running sequence ("), std::string::npos) << line;
  EXPECT_TRUE(line.ends_with("; KV representation: " + describe_kv_representation(*dev, c, g.bytes_per_token())))
      << line;
  EXPECT_NE(line.find("; linear-attention state: conv bf16 ["), std::string::npos) << line;
  EXPECT_EQ(plan_kv_pool({.state_slots = 0}, *dev, c, {}).status().message(),
            "kv pool sizing: the model keeps linear-attention state per sequence, so the pool needs between 1 and "
            "1048576 state slots (--max-batch), not 0");
  // A model without state: no slots in the line.
  const model::ModelConfig tiny = model::synthetic_preset_config("tiny").value();
  auto tiny_plan = plan_kv_pool({.memory_mb = 4}, *dev, tiny, {});
  ASSERT_TRUE(tiny_plan.ok());
  EXPECT_EQ(describe_kv_pool(*tiny_plan, *dev, tiny, false).find("state slots"), std::string::npos);
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
