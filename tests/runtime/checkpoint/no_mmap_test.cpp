// LoadOptions::use_mmap = false (the CLI's --no-mmap): the checkpoint is read into memory at open. Weights
// and engine results are bit-identical to a mapped load, and truncating the files afterwards changes
// nothing; a mapped checkpoint truncated under a run dies with SIGBUS (the documented reason for the option).
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/runner.h"
#include "support/checkpoint_edit.h"
#include "support/sanitizers.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

using testing::TempDir;

using testing::all_views;

// The bytes of every view.
std::vector<std::vector<char>> snapshot(const Checkpoint& ck) {
  std::vector<std::vector<char>> out;
  for (const TensorView& v : all_views(ck.weights())) {
    const char* p = static_cast<const char*>(v.data());
    out.emplace_back(p, p + v.numel() * static_cast<int64_t>(dtype_size(v.dtype())));
  }
  return out;
}

TEST(NoMmap, weights_are_bit_identical_to_the_mapped_ones) {
  for (const int shards : {1, 3}) {
    TempDir dir;
    ASSERT_TRUE(write_synthetic_checkpoint("tiny", 5, dir.path(), shards).ok());
    const Checkpoint mapped = Checkpoint::open(dir.path()).value();
    Result<Checkpoint> read = Checkpoint::open(dir.path(), {.use_mmap = false});
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    ASSERT_EQ(read->store().files().size(), static_cast<size_t>(shards));
    for (const auto& f : read->store().files()) EXPECT_FALSE(f->mapping().is_mapped());
    for (const auto& f : mapped.store().files()) EXPECT_TRUE(f->mapping().is_mapped());
    EXPECT_EQ(snapshot(*read), snapshot(mapped)) << shards;
    EXPECT_EQ(read->mapped_weight_bytes(), mapped.mapped_weight_bytes());
  }
  // F32 files, kept native or converted to bf16.
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint(synthetic_preset_config("tiny").value(), 6, dir.path(), 2, DType::kF32).ok());
  for (const WeightPrecision precision : {WeightPrecision::kNative, WeightPrecision::kBF16}) {
    const Checkpoint mapped = Checkpoint::open(dir.path(), {.precision = precision}).value();
    const Checkpoint read = Checkpoint::open(dir.path(), {.precision = precision, .use_mmap = false}).value();
    EXPECT_EQ(snapshot(read), snapshot(mapped));
  }
}

// Tokens and logits of a few greedy requests on `ck`.
std::vector<engine::RequestResult> generate(const Checkpoint& ck) {
  const ModelConfig& c = ck.config();
  auto dev = runtime::DeviceOperator::create({});
  EXPECT_TRUE(dev.ok()) << dev.status().to_string();
  auto pool =
      runtime::KvPagePool::create(dev->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}), 16);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  auto runner = ModelRunner::create(ck, *dev, *pool);
  EXPECT_TRUE(runner.ok()) << runner.status().to_string();
  engine::LocalExecutor executor(**runner);
  engine::Engine eng(executor, *pool, {.max_batch = 4, .record_logits = true});
  for (int r = 0; r < 3; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < 5 + 7 * r; ++i) q.prompt.push_back(static_cast<int32_t>((97 * i + 13 * r + 1) % c.vocab_size));
    q.max_new_tokens = 8;
    EXPECT_TRUE(eng.submit(std::move(q)).ok());
  }
  const Status st = eng.run_to_completion();
  EXPECT_TRUE(st.ok()) << st.to_string();
  return eng.results();
}

TEST(NoMmap, engine_results_are_bit_identical) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 8, dir.path()).ok());
  const Checkpoint mapped = Checkpoint::open(dir.path()).value();
  const Checkpoint read = Checkpoint::open(dir.path(), {.use_mmap = false}).value();
  const std::vector<engine::RequestResult> a = generate(mapped), b = generate(read);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].tokens.size(), 8u);
    EXPECT_EQ(a[r].tokens, b[r].tokens) << r;
    ASSERT_EQ(a[r].logits.size(), b[r].logits.size());
    EXPECT_EQ(std::memcmp(a[r].logits.data(), b[r].logits.data(), a[r].logits.size() * sizeof(float)), 0) << r;
  }
}

TEST(NoMmap, truncating_the_files_after_open_changes_nothing) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 4, dir.path()).ok());
  std::vector<std::vector<char>> want;
  {
    const Checkpoint mapped = Checkpoint::open(dir.path()).value();
    want = snapshot(mapped);
  }  // unmapped before the truncation
  const Checkpoint read = Checkpoint::open(dir.path(), {.use_mmap = false}).value();
  const std::string file = (dir / "model.safetensors").string();
  ASSERT_EQ(::truncate(file.c_str(), 64), 0);
  EXPECT_EQ(snapshot(read), want);  // every page of a mapping would raise SIGBUS here
  EXPECT_TRUE(read.check_finite().ok());
  // The truncated file itself is refused at the next open, mapped or not.
  for (const bool use_mmap : {true, false}) {
    const Result<Checkpoint> again = Checkpoint::open(dir.path(), {.use_mmap = use_mmap});
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().message().rfind(file + ": header length ", 0), 0u) << again.status().message();
  }
}

// What --no-mmap exists for: a mapped checkpoint truncated during a run kills the process at the next touch
// of a page past the new end (documented in docs/model_loading.md).
TEST(NoMmapDeathTest, truncating_a_mapped_file_raises_sigbus) {
  TempDir dir;
  ASSERT_TRUE(write_synthetic_checkpoint("tiny", 4, dir.path()).ok());
  const auto touch_after_truncation = [&] {
    const Checkpoint ck = Checkpoint::open(dir.path()).value();  // populated: every page was read at open
    const std::string file = (dir / "model.safetensors").string();
    if (::truncate(file.c_str(), 64) != 0) std::abort();
    volatile float sum = 0;
    for (const TensorView& v : all_views(ck.weights())) sum = sum + static_cast<float>(v.data_as<const uint16_t>()[0]);
    std::_Exit(0);  // not reached
  };
  if (genbridge::testing::address_sanitizer_linked()) {
    EXPECT_DEATH(touch_after_truncation(), "BUS");  // AddressSanitizer reports the signal and exits
  } else {
    EXPECT_EXIT(touch_after_truncation(), ::testing::KilledBySignal(SIGBUS), "");
  }
}

}  // namespace
}  // namespace genbridge::model
