// The relay of a serving job (afd/serve_relay.h) over the in-process transport: its messages' bytes, the
// order in which requests go down and tokens come up, the wait's answers, and the deadlines that name a rank
// that never starts or falls silent while it holds requests. The whole serving path through it (service,
// engines, bit identity) is tested by tests/tools/serve_afd_test.cpp and, under mpirun, tests/serve.
#include "afd/serve_relay.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>
#include <vector>

#include "afd/transports/inproc/inproc_transport.h"

namespace genbridge::afd {
namespace {

using std::chrono::milliseconds;

engine::Request request(int64_t id) {
  return engine::Request{.id = id,
                         .prompt = {1, 2, static_cast<int32_t>(id)},
                         .max_new_tokens = 7,
                         .stop_tokens = {5, 9},
                         .sampling = {.temperature = 0.5f,
                                      .top_k = 3,
                                      .top_p = 0.75f,
                                      .seed = 42,
                                      .min_p = 0.125f,
                                      .presence_penalty = -0.5f,
                                      .frequency_penalty = 1.5f,
                                      .repetition_penalty = 1.25f,
                                      .logit_bias = {{4, -100.f}, {static_cast<int32_t>(id), 2.5f}},
                                      .allowed_token_ids = {1, static_cast<int32_t>(id), 9},
                                      .min_tokens = 3},
                         .logprobs = 2,
                         .forced = {6, static_cast<int32_t>(id)},
                         .priority = -3};
}

TEST(ServeRelay, down_and_up_messages_round_trip) {
  RelayDown d{.submit = {request(3), request(8)}, .cancel = {1, 2}, .stopping = true, .others_busy = true};
  Result<RelayDown> d2 = decode_relay_down(encode_relay_down(d));
  ASSERT_TRUE(d2.ok()) << d2.status().to_string();
  ASSERT_EQ(d2->submit.size(), 2u);
  const engine::Request& r = d2->submit[1];
  EXPECT_EQ(r.id, 8);
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{1, 2, 8}));
  EXPECT_EQ(r.max_new_tokens, 7);
  EXPECT_EQ(r.stop_tokens, (std::vector<int32_t>{5, 9}));
  EXPECT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 3);
  EXPECT_EQ(r.sampling.top_p, 0.75f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_EQ(r.sampling.min_p, 0.125f);
  EXPECT_EQ(r.sampling.presence_penalty, -0.5f);
  EXPECT_EQ(r.sampling.frequency_penalty, 1.5f);
  EXPECT_EQ(r.sampling.repetition_penalty, 1.25f);
  EXPECT_EQ(r.sampling.logit_bias, (std::vector<std::pair<int32_t, float>>{{4, -100.f}, {8, 2.5f}}));
  EXPECT_EQ(r.sampling.allowed_token_ids, (std::vector<int32_t>{1, 8, 9}));
  EXPECT_EQ(r.sampling.min_tokens, 3);
  EXPECT_EQ(r.forced, (std::vector<int32_t>{6, 8}));
  EXPECT_EQ(r.priority, -3);
  EXPECT_EQ(d2->cancel, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(d2->stopping);
  EXPECT_TRUE(d2->others_busy);

  RelayUp u{.tokens = {{.id = 3, .token = 17},
                       {.id = 8,
                        .token = 4,
                        .has_logprobs = true,
                        .logprobs = {.sampled = {4, -0.25}, .top = {{4, -0.25}, {6, -1.5}}}}},
            .finishes = {{.id = 3, .reason = engine::FinishReason::kError, .message = "non-finite logits"}},
            .running = 1,
            .kv_pages_used = 6,
            .counters = {.preemptions = 2, .prefix_cache_queries = 300, .prefix_cache_hits = 256, .prefix_cache_evictions = 1, .prefix_cache_pages = 5}};
  Result<RelayUp> u2 = decode_relay_up(encode_relay_up(u));
  ASSERT_TRUE(u2.ok()) << u2.status().to_string();
  ASSERT_EQ(u2->tokens.size(), 2u);
  EXPECT_EQ(u2->tokens[0].id, 3);
  EXPECT_EQ(u2->tokens[0].token, 17);
  EXPECT_FALSE(u2->tokens[0].has_logprobs);
  EXPECT_TRUE(u2->tokens[1].has_logprobs);
  EXPECT_EQ(u2->tokens[1].logprobs.sampled.logprob, -0.25);
  ASSERT_EQ(u2->tokens[1].logprobs.top.size(), 2u);
  EXPECT_EQ(u2->tokens[1].logprobs.top[1].token, 6);
  ASSERT_EQ(u2->finishes.size(), 1u);
  EXPECT_EQ(u2->finishes[0].reason, engine::FinishReason::kError);
  EXPECT_EQ(u2->finishes[0].message, "non-finite logits");
  EXPECT_EQ(u2->running, 1);
  EXPECT_EQ(u2->kv_pages_used, 6);
  EXPECT_EQ(u2->counters.preemptions, 2);
  EXPECT_EQ(u2->counters.prefix_cache_queries, 300);
  EXPECT_EQ(u2->counters.prefix_cache_hits, 256);
  EXPECT_EQ(u2->counters.prefix_cache_evictions, 1);
  EXPECT_EQ(u2->counters.prefix_cache_pages, 5);
}

TEST(ServeRelay, malformed_messages_name_what_is_wrong) {
  const std::string up = encode_relay_up({.finishes = {{.id = 1, .message = "x"}}});
  EXPECT_EQ(decode_relay_up(up.substr(0, up.size() - 1)).status().message(),
            "afd relay: a malformed up message: it ends early");
  EXPECT_EQ(decode_relay_up(up + "z").status().message(), "afd relay: a malformed up message: bytes left over");
  EXPECT_EQ(decode_relay_down(up).status().message(),
            "afd relay: a malformed down message: it does not start with the down marker");
}

// Attention ranks 0..n-1 as world ranks 0..n-1 of an in-process world: fns[r] runs on rank r's thread.
std::vector<Status> run(int n, const std::function<Status(Transport&, RelayOptions)>& hub_fn,
                        const std::function<Status(int a, Transport&, RelayOptions)>& link_fn, int64_t timeout_ms,
                        int64_t init_timeout_ms) {
  auto world = make_inproc_world(n, 5000);
  std::vector<std::string> names;
  std::vector<int> attention_world;
  for (int r = 0; r < n; ++r) {
    names.push_back("attention rank " + std::to_string(r) + " (world rank " + std::to_string(r) + ")");
    attention_world.push_back(r);
  }
  std::vector<Status> out(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Transport> t = make_inproc_transport(world, r);
      out[r] = t->init();
      const RelayOptions o{.attention_world = attention_world,
                           .rank_names = names,
                           .attention_rank = r,
                           .timeout_ms = timeout_ms,
                           .init_timeout_ms = init_timeout_ms};
      if (out[r].ok()) out[r] = r == 0 ? hub_fn(*t, o) : link_fn(r, *t, o);
      if (!out[r].ok()) fail_rank(*world, r, out[r]);
      t->close().ignore();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Polls `hub` until `want` messages arrived (bounded).
Status poll_until(RelayHub& hub, std::vector<std::pair<int, RelayUp>>* got, size_t want) {
  for (int i = 0; i < 20000 && got->size() < want; ++i) {
    GB_RETURN_IF_ERROR(hub.poll([&](int a, RelayUp&& up) { got->emplace_back(a, std::move(up)); }));
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return got->size() == want ? ok_status() : internal_error("the messages did not arrive");
}

// Two relayed ranks: each starts, gets its requests (two messages, in order) and the busy flag, answers
// with tokens and finishes, then stops when told. Attention rank 0 sees each rank's reports in order.
TEST(ServeRelay, requests_go_down_and_tokens_come_up_in_order) {
  std::vector<std::pair<int, RelayUp>> got;
  const std::vector<Status> s = run(
      3,
      [&](Transport& t, RelayOptions o) -> Status {
        GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayHub> hub, make_relay_hub(t, std::move(o)));
        GB_RETURN_IF_ERROR(hub->wait_ready());
        for (int a = 1; a <= 2; ++a) {
          GB_RETURN_IF_ERROR(hub->send(a, {.submit = {request(10 * a)}}));
          GB_RETURN_IF_ERROR(hub->send(a, {.submit = {request(10 * a + 1)}, .others_busy = true}));
        }
        GB_RETURN_IF_ERROR(poll_until(*hub, &got, 2));
        for (int a = 1; a <= 2; ++a) GB_RETURN_IF_ERROR(hub->send(a, {.stopping = true}));
        return hub->flush();
      },
      [](int a, Transport& t, RelayOptions o) -> Status {
        GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayLink> link, make_relay_link(t, std::move(o)));
        GB_RETURN_IF_ERROR(link->send({}));  // ready
        RelayDown down;
        while (down.submit.size() < 2) {
          GB_ASSIGN_OR_RETURN(const WorkWait w, link->wait(milliseconds(5000), false));
          if (w != WorkWait::kMine) return internal_error("no request arrived");
          GB_RETURN_IF_ERROR(link->take(&down));
        }
        if (down.submit[0].id != 10 * a || down.submit[1].id != 10 * a + 1 || !down.others_busy) {
          return internal_error("the requests or the flag are not the ones sent");
        }
        GB_ASSIGN_OR_RETURN(const WorkWait busy, link->wait(milliseconds(5000), true));
        if (busy != WorkWait::kOther) return internal_error("others busy: the wait did not return at once");
        GB_RETURN_IF_ERROR(link->send({.tokens = {{.id = 10 * a, .token = a}, {.id = 10 * a + 1, .token = a + 1}},
                                       .finishes = {{.id = 10 * a, .reason = engine::FinishReason::kLength}},
                                       .running = 1,
                                       .kv_pages_used = a}));
        RelayDown stop;
        while (!stop.stopping) {
          GB_ASSIGN_OR_RETURN(const WorkWait w, link->wait(milliseconds(5000), false));
          if (w == WorkWait::kTimeout) return internal_error("the stop did not arrive");
          GB_RETURN_IF_ERROR(link->take(&stop));
        }
        return link->flush();
      },
      1000, 5000);
  for (const Status& st : s) EXPECT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [a, up] : got) {
    ASSERT_EQ(up.tokens.size(), 2u);
    EXPECT_EQ(up.tokens[0].id, 10 * a);
    EXPECT_EQ(up.tokens[1].token, a + 1);
    ASSERT_EQ(up.finishes.size(), 1u);
    EXPECT_EQ(up.finishes[0].id, 10 * a);
    EXPECT_EQ(up.kv_pages_used, a);
  }
}

// A rank that holds a request and reports nothing for 2 x timeout_ms: attention rank 0's poll ends with an
// error naming it. A rank that never starts: wait_ready ends after init_timeout_ms naming it.
TEST(ServeRelay, a_silent_rank_holding_requests_times_out_naming_it) {
  Status hub_status;
  run(
      2,
      [&](Transport& t, RelayOptions o) -> Status {
        GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayHub> hub, make_relay_hub(t, std::move(o)));
        GB_RETURN_IF_ERROR(hub->wait_ready());
        GB_RETURN_IF_ERROR(hub->send(1, {.submit = {request(4)}}));
        std::vector<std::pair<int, RelayUp>> got;
        hub_status = poll_until(*hub, &got, 1);
        return hub_status;
      },
      [](int, Transport& t, RelayOptions o) -> Status {
        GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayLink> link, make_relay_link(t, std::move(o)));
        GB_RETURN_IF_ERROR(link->send({}));
        std::this_thread::sleep_for(milliseconds(1500));  // holds the request, says nothing
        return ok_status();
      },
      100, 5000);
  EXPECT_EQ(hub_status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(hub_status.message(),
            "afd relay: attention rank 0 (world rank 0) timed out after 200 ms waiting for attention rank 1 (world "
            "rank 1), which holds 1 request(s), to report its next step");
}

TEST(ServeRelay, a_rank_that_never_starts_serving_times_out_naming_it) {
  Status ready;
  run(
      3,
      [&](Transport& t, RelayOptions o) -> Status {
        GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayHub> hub, make_relay_hub(t, std::move(o)));
        ready = hub->wait_ready();
        return ready;
      },
      [](int a, Transport& t, RelayOptions o) -> Status {
        GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayLink> link, make_relay_link(t, std::move(o)));
        if (a == 1) GB_RETURN_IF_ERROR(link->send({}));
        std::this_thread::sleep_for(milliseconds(600));
        return ok_status();
      },
      1000, 150);
  EXPECT_EQ(ready.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ready.message(),
            "afd relay: attention rank 0 (world rank 0) timed out after 150 ms waiting for attention rank 2 (world "
            "rank 2) to start serving");
}

TEST(ServeRelay, each_side_refuses_the_other_sides_rank) {
  auto world = make_inproc_world(1, 1000);
  std::unique_ptr<Transport> t = make_inproc_transport(world, 0);
  ASSERT_TRUE(t->init().ok());
  const RelayOptions o{.attention_world = {0, 0}, .rank_names = {"attention rank 0 (world rank 0)"}};
  EXPECT_EQ(make_relay_link(*t, o).status().message(),
            "afd relay: attention rank 0 of 2 attention ranks cannot be the relay's link (rank 1 or more)");
  RelayOptions one = o;
  one.attention_world = {0};
  EXPECT_EQ(make_relay_hub(*t, one).status().message(),
            "afd relay: attention rank 0 of 1 attention ranks cannot be the relay's hub (attention rank 0)");
}

}  // namespace
}  // namespace genbridge::afd
