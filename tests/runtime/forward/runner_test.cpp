// ModelRunner over a paged KV cache whose sequences own more pages than their length needs (the engine's
// admission reserves pages for every token a request may generate). The block tables the runner builds
// must hold every page a sequence owns, and the result must not depend on how many pages are reserved or
// which pages they are: the same tokens give the same logits, bit for bit, as a sequence that owns only
// the pages it fills. Runs unchanged in every target build and KV representation.
#include "runtime/forward/runner.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/device/device_operator.h"
#include "runtime/engine/sampler.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::model {
namespace {

const Checkpoint& tiny() {
  static genbridge::testing::TempDir dir;
  static std::unique_ptr<Checkpoint> ck = [] {
    EXPECT_TRUE(write_synthetic_checkpoint("tiny", 5, dir / "tiny").ok());
    return std::make_unique<Checkpoint>(std::move(Checkpoint::open(dir / "tiny")).value());
  }();
  return *ck;
}

std::vector<int32_t> tokens_of(int64_t n, uint64_t salt) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) {
    t.push_back(static_cast<int32_t>(engine::uniform_from(salt, i) * static_cast<double>(tiny().config().vocab_size)));
  }
  return t;
}

// A sequence of Harness::run and the tokens its admission reserves pages for.
struct Sequence {
  runtime::SeqId id;
  int64_t reserve;  // tokens to reserve pages for at admission (0: none)
};

class Harness {
 public:
  explicit Harness(const std::string& kv, int64_t pages = 16) {
    const ModelConfig& c = tiny().config();
    dev_ = std::make_unique<runtime::DeviceOperator>(runtime::DeviceOperator::create({.kv_cache_dtype = kv}).value());
    pool_ = std::make_unique<runtime::KvPagePool>(
        runtime::KvPagePool::create(dev_->kv_page_geometry({c.num_hidden_layers, c.num_key_value_heads, c.head_dim}),
                                    pages)
            .value());
    auto r = ModelRunner::create(tiny(), *dev_, *pool_);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    runner_ = std::move(r).value();
  }
  runtime::KvPagePool& pool() { return *pool_; }

  // Prefills `tokens[0, prompt)` of every sequence together, then decodes the rest one token per step
  // (all sequences in one batch). Returns logits[seq][step] (step 0 = prefill).
  std::vector<std::vector<std::vector<float>>> run(const std::vector<Sequence>& seqs,
                                                   const std::vector<std::vector<int32_t>>& tokens, int64_t prompt) {
    const int64_t V = tiny().config().vocab_size, S = static_cast<int64_t>(seqs.size());
    const int64_t steps = static_cast<int64_t>(tokens[0].size()) - prompt + 1;
    ForwardBatch batch = runner_->make_batch(S * prompt, S);
    std::vector<float> logits(static_cast<size_t>(S * V));
    std::vector<std::vector<std::vector<float>>> out(seqs.size());
    std::vector<runtime::SeqId> ids;
    std::vector<int32_t> in, q_lens;
    for (size_t s = 0; s < seqs.size(); ++s) {
      EXPECT_TRUE(pool_->admit(seqs[s].id, prompt, seqs[s].reserve).ok());
      ids.push_back(seqs[s].id);
      in.insert(in.end(), tokens[s].begin(), tokens[s].begin() + prompt);
      q_lens.push_back(static_cast<int32_t>(prompt));
    }
    for (int64_t step = 0; step < steps; ++step) {
      if (step > 0) {
        in.clear();
        q_lens.assign(seqs.size(), 1);
        for (size_t s = 0; s < seqs.size(); ++s) {
          EXPECT_TRUE(pool_->append(seqs[s].id, 1).ok());
          in.push_back(tokens[s][prompt + step - 1]);
        }
      }
      const Status st = runner_->forward(batch, {in, ids, q_lens}, logits);
      EXPECT_TRUE(st.ok()) << "step " << step << ": " << st.to_string();
      if (!st.ok()) return {};
      for (int64_t s = 0; s < S; ++s) out[s].emplace_back(logits.begin() + s * V, logits.begin() + (s + 1) * V);
    }
    for (const Sequence& s : seqs) EXPECT_TRUE(pool_->release(s.id).ok());
    return out;
  }

 private:
  std::unique_ptr<runtime::DeviceOperator> dev_;
  std::unique_ptr<runtime::KvPagePool> pool_;
  std::unique_ptr<ModelRunner> runner_;
};

// Prompt of 100 tokens, then decode to 270 (crossing pages at 128 and 256). Sequence 1 reserves pages for
// 400 tokens (4 pages while it fills 1, then 2, then 3); sequence 2 reserves nothing and takes pages as it
// grows; both are also run alone with no reservation. Every forward's logits agree bit for bit.
TEST(ModelRunner, sequence_owning_more_pages_than_its_length_needs) {
  for (const std::string kv : {"auto", "quantized"}) {
    const std::vector<std::vector<int32_t>> toks = {tokens_of(270, 1), tokens_of(270, 2)};
    Harness mixed(kv);
    const auto both = mixed.run({{1, 400}, {2, 0}}, toks, 100);
    ASSERT_EQ(both.size(), 2u) << kv;
    for (size_t s = 0; s < 2; ++s) {
      Harness alone(kv);
      const auto one = alone.run({{7, 0}}, {toks[s]}, 100);
      ASSERT_EQ(one.size(), 1u) << kv;
      ASSERT_EQ(one[0].size(), both[s].size());
      for (size_t step = 0; step < one[0].size(); ++step) {
        ASSERT_EQ(one[0][step], both[s][step]) << kv << " sequence " << s << " step " << step;
      }
    }
  }
}

// The first forward of a 1-token prompt that reserved pages for 200 tokens: its block table has 2 pages
// while its length needs 1 (the forward of `genbridge run --prompt 1 --max-new-tokens 200` that failed).
TEST(ModelRunner, first_forward_of_a_one_token_prompt_with_a_two_page_reservation) {
  Harness reserved("auto"), plain("auto");
  const std::vector<std::vector<int32_t>> toks = {{42}};
  const auto a = reserved.run({{0, 200}}, toks, 1);
  const auto b = plain.run({{0, 0}}, toks, 1);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(a[0], b[0]);
}

}  // namespace
}  // namespace genbridge::model
