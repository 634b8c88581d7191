// `genbridge serve --afd` without HTTP: the service (tools/serve/service.h) feeding the attention ranks of an
// in-process AFD serving job (afd/serve_job.h). An idle server outlives the AFD deadline (keep-alive empty
// steps), greedy tokens equal the monolithic engine's, SIGTERM's drain ends every rank cleanly, and a
// failing FFN rank ends the requests and the job with its error. Each also with the attention ranks other
// than 0 relayed (afd/serve_relay.h), as under mpirun with several attention ranks. The HTTP side, curl and
// mpirun are tested on loopback by tests/serve/ (serve.afd.*).
#include "tools/serve_afd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>

#include "afd/serve_job.h"
#include "runtime/engine/sampler.h"
#include "runtime/engine/token_constraint.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"
#include "tools/serve/service.h"

namespace genbridge::tools {
namespace {

using serve::Clock;

struct Fixture {
  testing::TempDir dir;
  std::unique_ptr<model::Checkpoint> ckpt;
  std::unique_ptr<runtime::DeviceOperator> dev;
  Fixture() {
    EXPECT_TRUE(model::write_synthetic_checkpoint("tiny", 3, dir / "m").ok());
    ckpt = std::make_unique<model::Checkpoint>(std::move(model::Checkpoint::open(dir / "m")).value());
    dev = std::make_unique<runtime::DeviceOperator>(std::move(runtime::DeviceOperator::create({})).value());
  }
  runtime::KvPageGeometry geometry() const { return dev->kv_page_geometry(model::kv_model_shape(ckpt->config())); }
};
Fixture& fixture() {
  static Fixture f;
  return f;
}

constexpr int64_t kPages = 16;

std::vector<int32_t> prompt(int r) {
  std::vector<int32_t> p;
  for (int i = 0; i < 3 + 2 * r; ++i) {
    p.push_back(static_cast<int32_t>(engine::uniform_from(91 + r, i) * fixture().ckpt->config().vocab_size));
  }
  return p;
}

// The tokens of the monolithic engine for `request`.
std::vector<int32_t> monolithic(engine::Request request) {
  Fixture& f = fixture();
  auto pool = runtime::KvPagePool::create(f.geometry(), kPages);
  auto runner = model::ModelRunner::create(*f.ckpt, *f.dev, *pool);
  engine::LocalExecutor ex(**runner);
  engine::Engine eng(ex, *pool, {});
  EXPECT_TRUE(eng.submit(std::move(request)).ok());
  EXPECT_TRUE(eng.run_to_completion().ok());
  return eng.results().at(0).tokens;
}

// A stand-in for a grammar: only tokens t with t % 5 == residue may be drawn.
class ResidueConstraint : public engine::TokenConstraint {
 public:
  explicit ResidueConstraint(int residue) : residue_(residue) {}
  Result<int64_t> allowed_tokens(std::span<uint32_t> allowed, int64_t) override {
    std::fill(allowed.begin(), allowed.end(), 0u);
    int64_t n = 0;
    const int64_t vocab = fixture().ckpt->config().vocab_size;
    for (int64_t t = residue_; t < vocab; t += 5, ++n) allowed[t / 32] |= 1u << (t % 32);
    return n;
  }
  Status accept(int32_t token) override {
    return token % 5 == residue_ ? ok_status() : internal_error("a token outside the constraint was drawn");
  }

 private:
  int residue_;
};

// Greedy tokens of the monolithic engine for prompt(r), max_new tokens.
std::vector<int32_t> monolithic(int r, int max_new) {
  Fixture& f = fixture();
  auto pool = runtime::KvPagePool::create(f.geometry(), kPages);
  auto runner = model::ModelRunner::create(*f.ckpt, *f.dev, *pool);
  engine::LocalExecutor ex(**runner);
  engine::Engine eng(ex, *pool, {});
  EXPECT_TRUE(eng.submit({.id = 0, .prompt = prompt(r), .max_new_tokens = max_new}).ok());
  EXPECT_TRUE(eng.run_to_completion().ok());
  return eng.results().at(0).tokens;
}

struct Served {
  std::vector<int32_t> tokens;
  engine::FinishReason reason = engine::FinishReason::kLength;
  std::string message;
};

// Reads a stream to its end (bounded).
Served read_all(serve::RequestStream& s) {
  Served out;
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
  while (!s.wait(deadline, &out.tokens, &out.reason, &out.message) && Clock::now() < deadline) {
  }
  return out;
}

// The service and an in-process serving job in a thread.
struct Server {
  serve::GenerationService service;
  afd::ServeLiveMetrics live;
  Status job_status = internal_error("the job has not ended");
  std::thread job;
  Server(afd::ServeJobOptions o, int attention)
      : service(serve::WorkerPools{.workers = attention,
                                   .local_workers = o.relay_in_process ? 1 : 0,  // as genbridge serve under mpirun
                                   .pages_per_worker = kPages,
                                   .bytes_per_page = fixture().geometry().bytes_per_page()},
                {.max_batch = 8, .max_queued_requests = 64}) {
    o.live = &live;
    job = std::thread([this, o = std::move(o)] {
      job_status = afd::run_inproc_serve_job(*fixture().ckpt, *fixture().dev, kPages, o, service_worker_fn(service));
      if (!job_status.ok()) service.fail(job_status.to_string());
    });
  }
  ~Server() {
    if (job.joinable()) job.join();
  }
  std::shared_ptr<serve::RequestStream> submit(int r, int max_new) {
    auto s = service.submit({.prompt = prompt(r), .max_tokens = max_new});
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? *s : nullptr;
  }
};

struct Case {
  afd::ConnectorKind connector;
  int a, f, s;
  bool relay = false;
  int redundant = 0;  // redundant experts per MoE layer, placed from a load skewed toward experts 5 and 6
};
std::string case_name(const Case& k) {
  return std::string(k.connector == afd::ConnectorKind::kSync ? "sync_" : "async_") + std::to_string(k.a) + "A" +
         std::to_string(k.f) + "F_S" + std::to_string(k.s) + (k.relay ? "_relayed" : "") +
         (k.redundant > 0 ? "_" + std::to_string(k.redundant) + "_redundant_experts" : "");
}
void PrintTo(const Case& k, std::ostream* os) { *os << case_name(k); }

afd::ServeJobOptions options(const Case& k, int64_t timeout_ms) {
  afd::ServeJobOptions o;
  o.afd.num_attention = k.a;
  o.afd.num_ffn = k.f;
  o.afd.num_stages = k.s;
  o.afd.connector = k.connector;
  o.afd.async_dp = k.connector == afd::ConnectorKind::kAsync;
  o.afd.timeout_ms = timeout_ms;
  o.engine.max_batch = 8;
  o.relay_in_process = k.relay;
  o.afd.redundant_experts = k.redundant;
  if (k.redundant > 0) {
    const model::ModelConfig& c = fixture().ckpt->config();
    afd::ExpertLoad load{.source = "test", .num_experts = static_cast<int>(c.num_experts)};
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      if (!c.is_moe_layer(l)) continue;
      load.layers.push_back(static_cast<int>(l));
      std::vector<int64_t> rows(static_cast<size_t>(c.num_experts), 1);
      rows[5] = 50;
      rows[6] = 40;
      load.rows.push_back(rows);
    }
    o.expert_load = load;
  }
  return o;
}

class ServeAfd : public ::testing::TestWithParam<Case> {};

// Idle for 2.5x the deadline (5x the keep-alive interval) between requests: the job lives on and serves
// the monolithic engine's tokens; a request in flight at shutdown finishes; every rank ends without error.
// Without the keep-alive the FFN ranks end the job after the deadline (the requests after the pause fail).
TEST_P(ServeAfd, idle_past_the_deadline_then_serves_the_monolithic_tokens_and_drains) {
  const Case k = GetParam();
  constexpr int64_t kTimeoutMs = 1500;
  Server server(options(k, kTimeoutMs), k.a);
  Served first = read_all(*server.submit(0, 4));
  EXPECT_EQ(first.reason, engine::FinishReason::kLength) << first.message;
  EXPECT_EQ(first.tokens, monolithic(0, 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(5 * kTimeoutMs / 2));
  // Two at once: with two attention ranks, one each.
  auto a = server.submit(1, 5);
  auto b = server.submit(2, 3);
  Served ra = read_all(*a), rb = read_all(*b);
  EXPECT_EQ(ra.reason, engine::FinishReason::kLength) << ra.message;
  EXPECT_EQ(rb.reason, engine::FinishReason::kLength) << rb.message;
  EXPECT_EQ(ra.tokens, monolithic(1, 5));
  EXPECT_EQ(rb.tokens, monolithic(2, 3));
  EXPECT_GT(server.live.empty_steps.load(), 0) << "no keep-alive step was sent while idle";
  EXPECT_GT(server.live.decode_steps.load(), 0);
  // SIGTERM's drain: the request in flight finishes, nothing is cancelled, every rank ends OK.
  auto last = server.submit(3, 6);
  EXPECT_EQ(server.service.shutdown(Clock::now() + std::chrono::seconds(60)), 0);
  Served rl = read_all(*last);
  EXPECT_EQ(rl.reason, engine::FinishReason::kLength) << rl.message;
  EXPECT_EQ(rl.tokens, monolithic(3, 6));
  server.job.join();
  EXPECT_TRUE(server.job_status.ok()) << server.job_status.to_string();
  EXPECT_EQ(server.service.counters().kv_pages_used, 0);
}

// Three requests at once on three relayed attention ranks (one each, the last two on relayed ranks) with
// log-probabilities: the monolithic tokens, each token's log-probabilities, and the drain.
TEST_P(ServeAfd, concurrent_requests_with_logprobs_give_the_monolithic_tokens) {
  const Case k = GetParam();
  Server server(options(k, 20000), k.a);
  std::vector<std::shared_ptr<serve::RequestStream>> streams;
  for (int r = 0; r < 3; ++r) {
    auto s = server.service.submit({.prompt = prompt(r), .max_tokens = 6, .logprobs = 2});
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  for (int r = 0; r < 3; ++r) {
    Served got;
    std::vector<engine::TokenLogprobs> logprobs;
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(60);
    while (!streams[r]->wait(deadline, &got.tokens, &got.reason, &got.message, &logprobs) && Clock::now() < deadline) {
    }
    EXPECT_EQ(got.reason, engine::FinishReason::kLength) << got.message;
    EXPECT_EQ(got.tokens, monolithic(r, 6)) << "request " << r;
    ASSERT_EQ(logprobs.size(), got.tokens.size());
    for (size_t i = 0; i < got.tokens.size(); ++i) {
      EXPECT_EQ(logprobs[i].sampled.token, got.tokens[i]);
      EXPECT_EQ(logprobs[i].top.size(), 2u);
    }
  }
  EXPECT_EQ(server.service.shutdown(Clock::now() + std::chrono::seconds(60)), 0);
  server.job.join();
  EXPECT_TRUE(server.job_status.ok()) << server.job_status.to_string();
  EXPECT_EQ(server.service.counters().kv_pages_used, 0);
}

// Every field of a request reaches the engine that runs it, on a relayed rank too: the sampling controls
// (penalties, min_p, logit_bias, allowed_token_ids, min_tokens), seeded sampling, forced tokens, and a token
// constraint (a relayed rank cannot take one: such a request runs on attention rank 0). Four requests at once,
// each must give the monolithic engine's tokens for the same request.
TEST_P(ServeAfd, every_request_field_reaches_the_engine_that_runs_it) {
  const Case k = GetParam();
  Server server(options(k, 20000), k.a);
  const auto make = [](int r) {
    serve::GenerationRequest g{.prompt = prompt(r), .max_tokens = 8};
    g.sampling = {.temperature = 0.9f,
                  .top_p = 0.95f,
                  .seed = 7u + static_cast<uint64_t>(r),
                  .min_p = 0.01f,
                  .presence_penalty = 0.5f,
                  .frequency_penalty = 0.25f,
                  .repetition_penalty = 1.3f,
                  .logit_bias = {{prompt(r)[0], 4.f}, {3, -2.5f}},
                  .min_tokens = 2};
    g.stop_tokens = {11};
    if (r % 2 == 0) {
      g.constraint = std::make_shared<ResidueConstraint>(r % 5);
    } else {
      for (int32_t t = 0; t < 64; ++t) g.sampling.allowed_token_ids.push_back(3 * t + r);
      g.forced = {static_cast<int32_t>(5 + r), 9};
    }
    return g;
  };
  std::vector<std::shared_ptr<serve::RequestStream>> streams;
  for (int r = 0; r < 4; ++r) {
    auto s = server.service.submit(make(r));
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
  }
  for (int r = 0; r < 4; ++r) {
    Served got = read_all(*streams[r]);
    serve::GenerationRequest g = make(r);
    const std::vector<int32_t> want = monolithic({.id = 0,
                                                  .prompt = g.prompt,
                                                  .max_new_tokens = g.max_tokens,
                                                  .stop_tokens = g.stop_tokens,
                                                  .sampling = g.sampling,
                                                  .forced = g.forced,
                                                  .constraint = g.constraint});
    EXPECT_NE(got.reason, engine::FinishReason::kError) << got.message;
    EXPECT_EQ(got.tokens, want) << "request " << r;
  }
  EXPECT_EQ(server.service.shutdown(Clock::now() + std::chrono::seconds(60)), 0);
  server.job.join();
  EXPECT_TRUE(server.job_status.ok()) << server.job_status.to_string();
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, ServeAfd,
    ::testing::Values(Case{afd::ConnectorKind::kSync, 2, 1, 2}, Case{afd::ConnectorKind::kAsync, 2, 2, 1},
                      Case{afd::ConnectorKind::kSync, 2, 1, 2, true}, Case{afd::ConnectorKind::kAsync, 2, 2, 1, true},
                      Case{afd::ConnectorKind::kSync, 3, 1, 1, true}, Case{afd::ConnectorKind::kAsync, 3, 2, 2, true},
                      Case{afd::ConnectorKind::kAsync, 2, 2, 1, true, 4}),
    [](const auto& info) { return case_name(info.param); });

// An FFN rank whose expert compute fails at its 5th work item: the request in flight ends with the job's
// error naming the rank, the job returns it, the service refuses new requests, and every rank ends. Relayed:
// the request runs on attention rank 1 (the service gives the second request to it).
class ServeAfdFailure : public ::testing::TestWithParam<bool> {};
TEST_P(ServeAfdFailure, failing_ffn_rank_ends_the_request_and_the_job_naming_the_rank) {
  const bool relay = GetParam();
  afd::ServeJobOptions o = options({afd::ConnectorKind::kSync, 2, 1, 1, relay}, 20000);
  auto items = std::make_shared<std::atomic<int>>(0);
  o.ffn_hook = [items](int, const afd::FfnWorkItem&) -> Status {
    return ++*items == 5 ? internal_error("injected failure") : ok_status();
  };
  Server server(std::move(o), 2);
  std::shared_ptr<serve::RequestStream> first;
  if (relay) first = server.submit(1, 500);  // occupies attention rank 0
  Served r = read_all(*server.submit(0, 50));
  first.reset();  // the failed worker waits for every stream's reader to let go (at most 5 s)
  EXPECT_EQ(r.reason, engine::FinishReason::kError);
  EXPECT_NE(r.message.find("ffn rank 0 (world rank 2)"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("injected failure"), std::string::npos) << r.message;
  server.job.join();
  EXPECT_FALSE(server.job_status.ok());
  EXPECT_NE(server.job_status.message().find("ffn rank 0 (world rank 2) failed"), std::string::npos)
      << server.job_status.to_string();
  EXPECT_TRUE(server.service.failed());
  auto again = server.service.submit({.prompt = prompt(1), .max_tokens = 2});
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  server.service.shutdown(Clock::now());
}
INSTANTIATE_TEST_SUITE_P(Relay, ServeAfdFailure, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "relayed" : "in_process"); });

}  // namespace
}  // namespace genbridge::tools
