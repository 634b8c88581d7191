// Non-finite logits: a request whose logits hold NaN or +-Inf ends with FinishReason::kError
// and a message naming the request and the step; its pages are freed and the other requests complete with
// exactly the results they have without the fault. Checkpoints are the tiny preset with one element
// rewritten: one +Inf or one NaN in lm_head.weight (every request's logits), or one +Inf in the embedding
// row of a token that only one request feeds to the model (only that request's state overflows).
// Activations that overflow while staying finite end the request the same way, naming the block: a 2^100 in an
// embedding row (its square overflows the next RMSNorm's fp32 sum, which would then return 0 and the model
// would go on emitting token 0), or a 1e30 in a DeepSeek shared expert's down_proj.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "afd/engine_job.h"
#include "engine_harness.h"
#include "poisoned_checkpoint.h"
#include "runtime/engine/engine.h"

namespace genbridge::engine {
namespace {

using namespace genbridge::engine::harness;

struct Poisoned {
  genbridge::testing::TempDir dir;
  std::unique_ptr<Checkpoint> ck;
};

// `preset` (seed 7, as checkpoint(preset)) with element `index` of `tensor` set to `value`.
std::unique_ptr<Poisoned> poisoned(const std::string& tensor, int64_t index, float value,
                                   const std::string& preset = "tiny") {
  auto p = std::make_unique<Poisoned>();
  EXPECT_TRUE(model::write_synthetic_checkpoint(preset, 7, p->dir / "m").ok());
  const Status st = genbridge::testing::poison_tensor(p->dir / "m", tensor, index, value);
  EXPECT_TRUE(st.ok()) << st.to_string();
  auto ck = Checkpoint::open(p->dir / "m");
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  p->ck = std::make_unique<Checkpoint>(std::move(ck).value());
  return p;
}

std::vector<Request> requests() {
  const int64_t vocab = checkpoint("tiny").config().vocab_size;
  return {request_of(0, 5, 8, vocab), request_of(1, 20, 8, vocab), request_of(2, 130, 8, vocab)};
}

std::string message_prefix(int64_t id, int64_t step) { return fmt::format("request {}, step {}: ", id, step); }
constexpr const char* kMessageTail =
    "; the request was ended. The forward pass overflowed or the model's weights are not finite (genbridge run "
    "--check-weights scans them)";

// lm_head row 17 has one non-finite weight: logit 17 of every position is non-finite (+-Inf for an Inf
// weight, by the sign of the hidden element it multiplies; NaN for a NaN weight), nothing else is.
void check_lm_head_poison(float value, const std::vector<std::string>& shown) {
  const int64_t hidden = checkpoint("tiny").config().hidden_size;
  const auto p = poisoned("lm_head.weight", 17 * hidden + 5, value);
  const auto reqs = requests();
  RunTrace trace;
  const auto res = run_engine_on(*p->ck, {}, reqs, &trace);
  ASSERT_TRUE(trace.status.ok()) << "a request's non-finite logits must not fail the run: " << trace.status.to_string();
  ASSERT_EQ(res.size(), reqs.size());
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_EQ(res[r].reason, FinishReason::kError) << "request " << r;
    EXPECT_FALSE(completed(res[r]));
    EXPECT_TRUE(res[r].tokens.empty()) << "request " << r;
    EXPECT_TRUE(res[r].logits.empty()) << "request " << r;
    bool matched = false;
    for (const std::string& v : shown) {
      matched =
          matched || res[r].message == message_prefix(res[r].id, 0) +
                                           "the logits contain 1 non-finite value of 512 (first: token 17 = " + v +
                                           ")" + kMessageTail;
    }
    EXPECT_TRUE(matched) << res[r].message;
  }
  EXPECT_STREQ(finish_reason_name(FinishReason::kError), "error");
}

TEST(NonFiniteLogits, plus_inf_in_lm_head_ends_every_request_with_an_error_naming_request_and_step) {
  check_lm_head_poison(INFINITY, {"inf", "-inf"});
}

TEST(NonFiniteLogits, nan_in_lm_head_ends_every_request_with_an_error_naming_request_and_step) {
  check_lm_head_poison(NAN, {"nan"});
}

// Request `victim` generates token X at step 3; X is in no prompt and no other request generates it. With
// element 0 of X's embedding row set to `value`, the victim's state overflows when X is fed back (step 4,
// position prompt + 3): it keeps its 4 tokens and ends with an error naming the embedding; the others give
// the fault-free results bit for bit.
void check_embedding_poison(float value, const std::string& what) {
  const auto reqs = requests();
  const auto clean = run_engine({}, reqs);
  const int64_t hidden = checkpoint("tiny").config().hidden_size;
  auto used_elsewhere = [&](size_t victim, int32_t x) {
    for (size_t r = 0; r < reqs.size(); ++r) {
      const auto& p = reqs[r].prompt;
      if (std::find(p.begin(), p.end(), x) != p.end()) return true;
      const auto& t = clean[r].tokens;
      const auto end = r == victim ? t.begin() + 3 : t.end();
      if (std::find(t.begin(), end, x) != end) return true;
    }
    return false;
  };
  size_t victim = reqs.size();
  for (size_t r = 0; r < reqs.size() && victim == reqs.size(); ++r) {
    if (!used_elsewhere(r, clean[r].tokens[3])) victim = r;
  }
  ASSERT_LT(victim, reqs.size()) << "no request generates a token at step 3 that nothing else uses";
  const int32_t x = clean[victim].tokens[3];
  const auto p = poisoned("model.embed_tokens.weight", static_cast<int64_t>(x) * hidden, value);
  RunTrace trace;
  const auto res = run_engine_on(*p->ck, {}, reqs, &trace);
  ASSERT_TRUE(trace.status.ok()) << trace.status.to_string();
  for (size_t r = 0; r < reqs.size(); ++r) {
    if (r == victim) {
      EXPECT_EQ(res[r].reason, FinishReason::kError);
      EXPECT_EQ(res[r].tokens, std::vector<int32_t>(clean[r].tokens.begin(), clean[r].tokens.begin() + 4));
      EXPECT_EQ(res[r].logits, std::vector<float>(clean[r].logits.begin(), clean[r].logits.begin() + 4 * 512));
      const std::string position = std::to_string(reqs[r].prompt.size() + 3);
      EXPECT_EQ(res[r].message,
                message_prefix(reqs[r].id, 4) + fmt::format(fmt::runtime(what), position) + kMessageTail);
    } else {
      EXPECT_EQ(res[r].reason, FinishReason::kLength) << "request " << r;
      EXPECT_EQ(res[r].tokens, clean[r].tokens) << "request " << r;
      EXPECT_EQ(res[r].logits, clean[r].logits) << "request " << r;
    }
  }
}

TEST(NonFiniteLogits, overflow_in_one_request_ends_it_alone_and_the_others_are_unchanged) {
  check_embedding_poison(INFINITY,
                         "the hidden state of position {} is not finite after the embedding (element 0 = inf)");
}

TEST(NonFiniteLogits, saturating_embedding_ends_the_request_naming_the_embedding) {
  check_embedding_poison(0x1p100f,  // 1.3e30, exact in bf16
                         "the hidden state of position {} after the embedding overflows fp32 in the next RMSNorm (its "
                         "sum of squares exceeds 3.4e+38; largest element 1.26765e+30), which would make the norm "
                         "return 0");
}

// The boundary: tiny's hidden size is 128 and its embeddings are small, so one element x decides whether the
// row's fp32 sum of squares overflows: x = 1.7e19 (x^2 = 2.9e38) leaves the norm working and the request
// finishes; x = 1.9e19 (3.6e38) ends it at step 0 naming the embedding.
TEST(NonFiniteLogits, saturation_is_the_fp32_sum_of_squares_overflowing) {
  const int64_t hidden = checkpoint("tiny").config().hidden_size, vocab = checkpoint("tiny").config().vocab_size;
  Request q = request_of(0, 3, 4, vocab);
  q.prompt = {7, 7, 7};
  const auto below = poisoned("model.embed_tokens.weight", 7 * hidden + 3, 1.7e19f);
  const auto ok = run_engine_on(*below->ck, {}, {q});
  EXPECT_EQ(ok[0].reason, FinishReason::kLength) << ok[0].message;
  const auto above = poisoned("model.embed_tokens.weight", 7 * hidden + 3, 1.9e19f);
  RunTrace trace;
  const auto bad = run_engine_on(*above->ck, {}, {q}, &trace);
  ASSERT_TRUE(trace.status.ok()) << trace.status.to_string();
  EXPECT_EQ(bad[0].reason, FinishReason::kError);
  EXPECT_EQ(bad[0].message.rfind(message_prefix(0, 0) +
                                     "the hidden state of position 0 after the embedding overflows fp32 in the next "
                                     "RMSNorm (its sum of squares exceeds 3.4e+38; largest element 1.9",
                                 0),
            0u)
      << bad[0].message;
}

// tiny-dsv3: layer 0 is dense, layer 1 MoE with one ungated shared expert that every token passes. One
// 1e30 weight in it makes every token's layer-1 output overflow (finite, far beyond what the next norm's
// fp32 sum of squares holds): every request ends at step 0 naming position 0 and layer 1's MoE block.
TEST(NonFiniteLogits, saturating_deepseek_expert_names_the_moe_layer) {
  const auto p = poisoned("model.layers.1.mlp.shared_experts.down_proj.weight", 0, 1e30f, "tiny-dsv3");
  const int64_t vocab = p->ck->config().vocab_size;
  const std::vector<Request> reqs = {request_of(0, 5, 4, vocab), request_of(1, 9, 4, vocab)};
  RunTrace trace;
  const auto res = run_engine_on(*p->ck, {}, reqs, &trace);
  ASSERT_TRUE(trace.status.ok()) << trace.status.to_string();
  ASSERT_EQ(res.size(), reqs.size());
  for (size_t r = 0; r < res.size(); ++r) {
    EXPECT_EQ(res[r].reason, FinishReason::kError) << "request " << r;
    EXPECT_TRUE(res[r].tokens.empty());
    const std::string want = message_prefix(res[r].id, 0) +
                             "the hidden state of position 0 after layer 1's MoE block overflows fp32 in the next "
                             "RMSNorm (its sum of squares exceeds 3.4e+38; largest element ";
    EXPECT_EQ(res[r].message.rfind(want, 0), 0u) << res[r].message;
    EXPECT_NE(res[r].message.find("), which would make the norm return 0" + std::string(kMessageTail)),
              std::string::npos)
        << res[r].message;
  }
}

// The AFD engine (in-process, both connectors) reports the same per-request errors as the monolithic one:
// non-finite logits, and a hidden state that overflows inside the forward pass.
void check_afd_matches_monolithic(const Poisoned& poison) {
  const Poisoned* p = &poison;
  const auto mono = run_engine_on(*p->ck, {}, requests());
  auto dev = runtime::DeviceOperator::create({});
  ASSERT_TRUE(dev.ok());
  for (afd::ConnectorKind kind : {afd::ConnectorKind::kSync, afd::ConnectorKind::kAsync}) {
    afd::EngineJobOptions o;
    o.afd.num_attention = 2;
    o.afd.num_ffn = 1;
    o.afd.connector = kind;
    o.afd.async_dp = kind == afd::ConnectorKind::kAsync;
    o.afd.timeout_ms = 20000;
    auto job = afd::run_inproc_engine_job(*p->ck, *dev, requests(), 16, o);
    ASSERT_TRUE(job.ok()) << job.status().to_string();
    ASSERT_EQ(job->results.size(), mono.size());
    for (size_t r = 0; r < mono.size(); ++r) {
      EXPECT_EQ(job->results[r].reason, mono[r].reason) << "request " << r;
      EXPECT_EQ(job->results[r].message, mono[r].message) << "request " << r;
      EXPECT_EQ(job->results[r].tokens, mono[r].tokens) << "request " << r;
    }
  }
}

TEST(NonFiniteLogits, afd_reports_the_same_errors_as_the_monolithic_engine) {
  check_afd_matches_monolithic(*poisoned("lm_head.weight", 17 * checkpoint("tiny").config().hidden_size + 5, NAN));
}

TEST(NonFiniteLogits, afd_reports_the_same_activation_overflow_as_the_monolithic_engine) {
  // The embedding row of request 2's first prompt token: its prefill overflows at once.
  const int64_t tok = requests()[2].prompt[0];
  const auto p = poisoned("model.embed_tokens.weight", tok * checkpoint("tiny").config().hidden_size, 1e30f);
  EXPECT_EQ(run_engine_on(*p->ck, {}, requests())[2].reason, FinishReason::kError);
  check_afd_matches_monolithic(*p);
}

}  // namespace
}  // namespace genbridge::engine
