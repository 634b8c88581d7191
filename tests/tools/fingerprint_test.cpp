// The AFD fingerprint the run path fills (afd::EngineJobOptions::fingerprint): what it names and what
// changes it. The exchange and comparison across ranks are afd/engine_job's (tested there).
#include "tools/fingerprint.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tools/make_model/synthetic.h"
#include "tools/run_support.h"

namespace genbridge::tools {
namespace {

namespace fs = std::filesystem;

class Fingerprint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::temp_directory_path() / "genbridge_fp_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 1, root_ / "seed1").ok());
    ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 2, root_ / "seed2").ok());
    ASSERT_TRUE(model::write_synthetic_checkpoint("tiny", 1, root_ / "seed1_sharded", 3).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }
  static std::string identity(const fs::path& dir) {
    auto ckpt = model::Checkpoint::open(dir, {.populate = false});
    EXPECT_TRUE(ckpt.ok()) << ckpt.status().to_string();
    auto id = weight_identity(*ckpt);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.ok() ? *id : "";
  }
  static std::vector<afd::FingerprintItem> items(const RunOptions& o, const fs::path& dir) {
    auto ckpt = model::Checkpoint::open(dir, {.populate = false});
    EXPECT_TRUE(ckpt.ok());
    auto fp = run_fingerprint(o, *ckpt, make_requests(o, ckpt->config().vocab_size));
    EXPECT_TRUE(fp.ok()) << fp.status().to_string();
    return fp.ok() ? *fp : std::vector<afd::FingerprintItem>{};
  }
  // The names of the items whose values differ.
  static std::vector<std::string> differing(const std::vector<afd::FingerprintItem>& a,
                                            const std::vector<afd::FingerprintItem>& b) {
    EXPECT_EQ(a.size(), b.size());
    std::vector<std::string> names;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      EXPECT_EQ(a[i].name, b[i].name);
      if (a[i].value != b[i].value) names.push_back(a[i].name);
    }
    return names;
  }
  static inline fs::path root_;
};

TEST_F(Fingerprint, weight_identity_follows_content_not_path_or_time) {
  const std::string id1 = identity(root_ / "seed1");
  EXPECT_EQ(id1.size(), 16u + std::string(" (1 file, ").size() +
                            std::to_string(fs::file_size(root_ / "seed1" / "model.safetensors")).size() +
                            std::string(" bytes)").size());
  // A copy elsewhere, with new time stamps, is the same checkpoint.
  fs::copy(root_ / "seed1", root_ / "copy", fs::copy_options::recursive);
  EXPECT_EQ(identity(root_ / "copy"), id1);
  // Other weights of the same shapes are not.
  EXPECT_NE(identity(root_ / "seed2"), id1);
  EXPECT_NE(identity(root_ / "seed1_sharded"), id1);
  // One byte of the data section changed (the first, which the first sample covers).
  const fs::path f = root_ / "copy" / "model.safetensors";
  std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t header_len = 0;
  io.read(reinterpret_cast<char*>(&header_len), 8);
  io.seekg(static_cast<std::streamoff>(8 + header_len));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  io.seekp(static_cast<std::streamoff>(8 + header_len));
  io.write(&c, 1);
  io.close();
  EXPECT_NE(identity(root_ / "copy"), id1);
  fs::remove_all(root_ / "copy");
}

TEST_F(Fingerprint, the_same_names_in_the_same_order_whatever_the_flags) {
  RunOptions generated;
  generated.model_dir = (root_ / "seed1").string();
  RunOptions typed = generated;
  typed.prompts = {"1,2,3", "4"};
  typed.prompt_tokens = {{1, 2, 3}, {4}};
  const auto a = items(generated, root_ / "seed1"), b = items(typed, root_ / "seed1");
  std::vector<std::string> names;
  for (const auto& i : a) names.push_back(i.name);
  // clang-format off
  std::vector<std::string> want = {
      "build", "--model", "--preset", "--model-seed", "model config (--model)", "model weights (--model)",
      "--num-prompts", "--prompt-len", "--prompt", "--prompt-text", "prompts", "--max-new-tokens", "--stop-token",
      "--temperature", "--top-k", "--top-p", "--seed", "--max-batch", "--max-num-batched-tokens", "--preemption", "--enable-prefix-caching", "--kv-cache-dtype", "--kv-memory-mb", "--afd",
      "--afd-connector", "--afd-stages", "--afd-timeout", "--afd-warmup-steps", "--afd-transport", "--scheduling-policy", "--afd-link-latency-us", "--afd-link-gbps", "--afd-redundant-experts"};
  // clang-format on
  want.insert(std::find(want.begin(), want.end(), "--kv-memory-mb"), "--weight-quant");
  want.insert(std::find(want.begin(), want.end(), "--kv-memory-mb"), "--moe-dispatch");
  EXPECT_EQ(names, want);
  EXPECT_EQ(differing(a, b), (std::vector<std::string>{"--num-prompts", "--prompt-len", "--prompt", "prompts"}));
  EXPECT_EQ(b[8].value, "2 prompts, 4 tokens, digest " + b[8].value.substr(b[8].value.size() - 16));
  EXPECT_EQ(a[6].value, "8");
  EXPECT_EQ(b[6].value, "(not given)");
}

// --prompt-text: the ids the tokenizer gave take part (ranks whose tokenizer.json differ disagree there).
TEST_F(Fingerprint, prompt_text_compares_the_encoded_ids) {
  RunOptions generated;
  generated.model_dir = (root_ / "seed1").string();
  RunOptions text = generated;
  text.prompt_texts = {"hello", "world"};
  text.prompt_text_tokens = {{104, 101}, {119}};
  const auto a = items(generated, root_ / "seed1"), b = items(text, root_ / "seed1");
  EXPECT_EQ(differing(a, b), (std::vector<std::string>{"--num-prompts", "--prompt-len", "--prompt-text", "prompts"}));
  EXPECT_EQ(b[9].name, "--prompt-text");
  EXPECT_EQ(b[9].value, "2 prompts, 3 tokens, digest " + b[9].value.substr(b[9].value.size() - 16));
  EXPECT_EQ(a[9].value, "(not given)");
  RunOptions other = text;  // the same text, another tokenizer's ids
  other.prompt_text_tokens = {{104, 101}, {120}};
  EXPECT_EQ(differing(b, items(other, root_ / "seed1")), (std::vector<std::string>{"--prompt-text", "prompts"}));
}

TEST_F(Fingerprint, each_setting_changes_its_own_item) {
  RunOptions base;
  base.model_dir = (root_ / "seed1").string();
  base.afd = "2A1F";
  const auto ref = items(base, root_ / "seed1");
  auto changed = [&](auto edit, const fs::path& dir) {
    RunOptions o = base;
    edit(o);
    return differing(ref, items(o, dir));
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(changed([](RunOptions& o) { o.max_new_tokens = 33; }, root_ / "seed1"), V{"--max-new-tokens"});
  EXPECT_EQ(changed([](RunOptions& o) { o.num_prompts = 9; }, root_ / "seed1"), (V{"--num-prompts", "prompts"}));
  EXPECT_EQ(changed([](RunOptions& o) { o.prompt_len = 31; }, root_ / "seed1"), (V{"--prompt-len", "prompts"}));
  EXPECT_EQ(changed([](RunOptions& o) { o.temperature = 0.5f; }, root_ / "seed1"), V{"--temperature"});
  EXPECT_EQ(changed([](RunOptions& o) { o.top_k = 5; }, root_ / "seed1"), V{"--top-k"});
  EXPECT_EQ(changed([](RunOptions& o) { o.top_p = 0.9f; }, root_ / "seed1"), V{"--top-p"});
  EXPECT_EQ(changed([](RunOptions& o) { o.seed = 7; }, root_ / "seed1"), V{"--seed"});
  EXPECT_EQ(changed([](RunOptions& o) { o.stop_tokens = {5, 6}; }, root_ / "seed1"), V{"--stop-token"});
  EXPECT_EQ(changed([](RunOptions& o) { o.max_batch = 4; }, root_ / "seed1"), V{"--max-batch"});
  EXPECT_EQ(changed([](RunOptions& o) { o.kv_cache_dtype = "quantized"; }, root_ / "seed1"), V{"--kv-cache-dtype"});
  EXPECT_EQ(changed([](RunOptions& o) { o.weight_quant = "auto"; }, root_ / "seed1"), V{"--weight-quant"});
  EXPECT_EQ(changed([](RunOptions& o) { o.moe_dispatch = "quantized"; }, root_ / "seed1"), V{"--moe-dispatch"});
  EXPECT_EQ(changed([](RunOptions& o) { o.kv_memory_mb = 64; }, root_ / "seed1"), V{"--kv-memory-mb"});
  EXPECT_EQ(changed([](RunOptions& o) { o.afd = "2A2F"; }, root_ / "seed1"), V{"--afd"});
  EXPECT_EQ(changed([](RunOptions& o) { o.afd_connector = "async"; }, root_ / "seed1"), V{"--afd-connector"});
  EXPECT_EQ(changed([](RunOptions& o) { o.afd_stages = 2; }, root_ / "seed1"), V{"--afd-stages"});
  EXPECT_EQ(changed([](RunOptions& o) { o.afd_timeout_s = 5; }, root_ / "seed1"), V{"--afd-timeout"});
  // Another checkpoint: its weights (same config: the same preset); the path itself is not compared.
  EXPECT_EQ(changed([&](RunOptions& o) { o.model_dir = (root_ / "seed2").string(); }, root_ / "seed2"),
            (V{"model weights (--model)"}));
  // The same checkpoint under another path (another node's mount point) agrees.
  EXPECT_EQ(changed([&](RunOptions& o) { o.model_dir = (root_ / "seed1" / ".." / "seed1").string(); }, root_ / "seed1"),
            V{});
  // The synthetic model: --preset and --model-seed take part.
  RunOptions synthetic = base;
  synthetic.model_dir.clear();
  synthetic.preset = "tiny";
  synthetic.model_seed = 1;
  EXPECT_EQ(differing(ref, items(synthetic, root_ / "seed1")), (V{"--model", "--preset", "--model-seed"}));
}

TEST_F(Fingerprint, values_read_as_typed) {
  RunOptions o;
  o.model_dir = (root_ / "seed1" / ".." / "seed1").string();
  o.temperature = 0.7f;
  o.afd = "2A1F";
  o.afd_timeout_s = 2.5;
  o.stop_tokens = {3, 9};
  const auto fp = items(o, root_ / "seed1");
  auto value = [&](const std::string& name) {
    for (const auto& i : fp) {
      if (i.name == name) return i.value;
    }
    return std::string("<missing>");
  };
  EXPECT_EQ(value("--model"), "(given: a checkpoint directory)");  // the path is not compared
  EXPECT_EQ(value("--temperature"), "0.7");
  EXPECT_EQ(value("--afd-timeout"), "2.5");
  EXPECT_EQ(value("--stop-token"), "3,9");
  EXPECT_EQ(value("--preset"), "(not given)");
  EXPECT_EQ(value("model config (--model)")
                .rfind("4 layers, hidden 128, heads 4/2 x 64, 8 experts top-2, vocab 512 (config.json digest ", 0),
            0u)
      << value("model config (--model)");
}

}  // namespace
}  // namespace genbridge::tools

// serve under mpirun: --weight-quant is an item of the serving job's fingerprint (ranks started with different
// schemes disagree there, naming the flag).
namespace genbridge::tools {
namespace {
TEST_F(Fingerprint, serve_weight_quant_changes_its_own_item) {
  auto ckpt = model::Checkpoint::open(root_ / "seed1", {.populate = false});
  ASSERT_TRUE(ckpt.ok());
  RunOptions base;
  base.model_dir = (root_ / "seed1").string();
  base.afd = "1A1F";
  base.afd_transport = "mpi";
  RunOptions quant = base;
  quant.weight_quant = "w8a8";
  auto a = serve_fingerprint(base, *ckpt), b = serve_fingerprint(quant, *ckpt);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(differing(*a, *b), std::vector<std::string>{"--weight-quant"});
}
}  // namespace
}  // namespace genbridge::tools
