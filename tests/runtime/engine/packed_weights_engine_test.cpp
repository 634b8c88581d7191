// The engine with packed weights (docs/linear.md, "Packed weights": the attention projections and the LM head
// packed when the runner is made, each expert on its first use) gives the tokens and logits of the checkpoint
// layout (GENBRIDGE_PACKED_WEIGHTS=0), bit for bit, for every model family; a malformed setting is refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/engine/engine_harness.h"

namespace genbridge::engine {
namespace {

using harness::RunConfig;

// Sets GENBRIDGE_PACKED_WEIGHTS for its lifetime (ctest runs each test in its own process).
struct PackedSetting {
  explicit PackedSetting(const char* v) { setenv("GENBRIDGE_PACKED_WEIGHTS", v, 1); }
  ~PackedSetting() { unsetenv("GENBRIDGE_PACKED_WEIGHTS"); }
};

std::vector<Request> requests(int64_t vocab) {
  std::vector<Request> reqs;
  for (int64_t i = 0; i < 6; ++i) reqs.push_back(harness::request_of(i, 3 + 37 * i, 6, vocab));
  return reqs;
}

class Packed : public ::testing::TestWithParam<std::string> {};

TEST_P(Packed, tokens_and_logits_equal_the_checkpoint_layout) {
  const RunConfig rc{.preset = GetParam(), .max_batch = 4};
  const int64_t vocab = harness::checkpoint(rc.preset).config().vocab_size;
  std::vector<RequestResult> want, got;
  {
    const PackedSetting off("0");
    want = harness::run_engine(rc, requests(vocab));
  }
  got = harness::run_engine(rc, requests(vocab));  // the default: packed
  harness::expect_same_results(got, want);
}

INSTANTIATE_TEST_SUITE_P(Presets, Packed,
                         ::testing::Values("tiny", "tiny-gemma", "tiny-dsa", "tiny-dsv3-noq", "tiny-qwen35",
                                           "tiny-dsv4"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(PackedWeightsSetting, anything_but_0_or_1_is_refused_when_the_runner_is_made) {
  const model::Checkpoint& ck = harness::checkpoint("tiny");
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  auto pool = runtime::KvPagePool::create(dev->kv_page_geometry(model::kv_model_shape(ck.config())), 8, 2);
  ASSERT_TRUE(pool.ok());
  const PackedSetting bad("yes");
  auto runner = model::ModelRunner::create(ck, *dev, *pool);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().message(), "GENBRIDGE_PACKED_WEIGHTS is 'yes'; it must be 0 or 1");
  // An FFN rank makes only an ExpertBank: its first computation says the same.
  const model::ExpertBank bank(ck);
  EXPECT_EQ(bank.prepare(0, bank.num_experts()).message(), "GENBRIDGE_PACKED_WEIGHTS is 'yes'; it must be 0 or 1");
}

}  // namespace
}  // namespace genbridge::engine
