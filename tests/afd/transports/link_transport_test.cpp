// The link model (afd/transports/link_transport.h) over the in-process transport: a data-channel message is
// held back until its arrival time (latency + bytes over the bandwidth, messages on one link in turn), the
// control plane is not delayed, the wait leaves the core free, deadlines hold, and ranks that disagree on
// the link settings get an error that says so.

#include "afd/transports/link_transport.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "afd/transports/inproc/inproc_transport.h"

namespace genbridge::afd {
namespace {

struct Pair {
  Pair(LinkModel link_a, LinkModel link_b) {
    a = link_a.enabled() ? make_link_transport(make_inproc_transport(world, 0), link_a)
                         : make_inproc_transport(world, 0);
    b = link_b.enabled() ? make_link_transport(make_inproc_transport(world, 1), link_b)
                         : make_inproc_transport(world, 1);
    std::thread t([&] { EXPECT_TRUE(b->init().ok()); });
    EXPECT_TRUE(a->init().ok());
    t.join();
  }
  explicit Pair(LinkModel link) : Pair(link, link) {}
  std::shared_ptr<InprocWorld> world = make_inproc_world(2, 5000);
  std::unique_ptr<Transport> a, b;
};

RequestId must(Result<RequestId> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : kNoRequest;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

TEST(LinkModel, wire_time_is_bits_over_the_bandwidth_rounded_up) {
  EXPECT_EQ((LinkModel{.latency_us = 0, .bandwidth_mbps = 100000}.wire_ns(1000000)), 80000);  // 1 MB at 100 Gb/s
  EXPECT_EQ((LinkModel{.latency_us = 0, .bandwidth_mbps = 3}.wire_ns(1)), 2667);              // 8 bits at 3 Mb/s
  EXPECT_EQ((LinkModel{.latency_us = 5, .bandwidth_mbps = 0}.wire_ns(1 << 30)), 0);           // unlimited
  EXPECT_FALSE(LinkModel{}.enabled());
  EXPECT_TRUE((LinkModel{.latency_us = 0, .bandwidth_mbps = 1}.enabled()));
}

TEST(LinkTransport, a_dispatch_message_arrives_after_the_latency_intact_and_without_the_header) {
  Pair p(LinkModel{.latency_us = 30000, .bandwidth_mbps = 0});
  std::vector<int> sent = {1, 2, 3, 4, 5}, got(5, 0);
  const ConstSegment s{sent.data(), sent.size() * sizeof(int)};
  const MutSegment r{got.data(), got.size() * sizeof(int)};
  RequestId rid = must(p.b->irecv(0, Channel::kDispatch, 3, {&r, 1}));
  const auto t0 = std::chrono::steady_clock::now();
  RequestId sid = must(p.a->isend(1, Channel::kDispatch, 3, {&s, 1}));
  const double cpu0 = thread_cpu_ms();
  Completion c;
  ASSERT_TRUE(p.b->wait_any({&rid, 1}, deadline_after_ms(5000), &c).ok());
  const double waited = ms_since(t0), cpu = thread_cpu_ms() - cpu0;
  EXPECT_GE(waited, 30.0);
  EXPECT_LT(waited, 1000.0);
  EXPECT_LT(cpu, 10.0) << "the receiver spun for " << cpu << " ms of CPU while the link delayed the message";
  EXPECT_EQ(got, sent);
  EXPECT_EQ(c.bytes, sent.size() * sizeof(int));
  EXPECT_EQ(c.source, 0);
  EXPECT_EQ(c.tag, 3);
  Completion sc;
  ASSERT_TRUE(p.a->wait_any({&sid, 1}, deadline_after_ms(5000), &sc).ok());
  EXPECT_EQ(sc.bytes, sent.size() * sizeof(int));
}

TEST(LinkTransport, messages_on_one_link_take_turns_at_the_bandwidth_and_keep_their_order) {
  // 125000 bytes at 10 Mb/s = 100 ms each (the 16-byte header adds 12.8 us): the second arrives >= 200 ms.
  Pair p(LinkModel{.latency_us = 0, .bandwidth_mbps = 10});
  std::vector<char> m1(125000, 'a'), m2(125000, 'b'), g1(125000), g2(125000);
  const ConstSegment s1{m1.data(), m1.size()}, s2{m2.data(), m2.size()};
  const MutSegment r1{g1.data(), g1.size()}, r2{g2.data(), g2.size()};
  RequestId ids[2] = {must(p.b->irecv(0, Channel::kCombine, 0, {&r1, 1})),
                      must(p.b->irecv(0, Channel::kCombine, 0, {&r2, 1}))};
  const auto t0 = std::chrono::steady_clock::now();
  must(p.a->isend(1, Channel::kCombine, 0, {&s1, 1}));
  must(p.a->isend(1, Channel::kCombine, 0, {&s2, 1}));
  Completion c;
  Result<int> first = p.b->wait_any(ids, deadline_after_ms(5000), &c);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(*first, 0);
  EXPECT_GE(ms_since(t0), 100.0);
  ids[0] = kNoRequest;
  Result<int> second = p.b->wait_any(ids, deadline_after_ms(5000), &c);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(*second, 1);
  EXPECT_GE(ms_since(t0), 200.0);
  EXPECT_EQ(g1, m1);
  EXPECT_EQ(g2, m2);
}

TEST(LinkTransport, the_control_plane_is_not_delayed) {
  Pair p(LinkModel{.latency_us = 2000000, .bandwidth_mbps = 0});
  int v = 42, got = 0;
  const ConstSegment s{&v, sizeof v};
  const MutSegment r{&got, sizeof got};
  RequestId rid = must(p.b->irecv(0, Channel::kControl, 1, {&r, 1}));
  const auto t0 = std::chrono::steady_clock::now();
  must(p.a->isend(1, Channel::kControl, 1, {&s, 1}));
  Completion c;
  ASSERT_TRUE(p.b->wait_any({&rid, 1}, deadline_after_ms(5000), &c).ok());
  EXPECT_LT(ms_since(t0), 1000.0);
  EXPECT_EQ(got, 42);
  EXPECT_EQ(c.bytes, sizeof v);
}

TEST(LinkTransport, a_wait_ends_at_its_deadline_and_the_message_still_arrives_later) {
  Pair p(LinkModel{.latency_us = 300000, .bandwidth_mbps = 0});
  int v = 7, got = 0;
  const ConstSegment s{&v, sizeof v};
  const MutSegment r{&got, sizeof got};
  RequestId rid = must(p.b->irecv(0, Channel::kDispatch, 0, {&r, 1}));
  must(p.a->isend(1, Channel::kDispatch, 0, {&s, 1}));
  Completion c;
  Result<int> early = p.b->wait_any({&rid, 1}, deadline_after_ms(50), &c);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.status().code(), StatusCode::kDeadlineExceeded);
  Result<bool> polled = p.b->test(rid, &c);
  ASSERT_TRUE(polled.ok());
  EXPECT_FALSE(*polled);  // landed, not yet arrived
  Result<int> later = p.b->wait_any({&rid, 1}, deadline_after_ms(5000), &c);
  ASSERT_TRUE(later.ok()) << later.status().to_string();
  EXPECT_EQ(got, 7);
}

TEST(LinkTransport, wait_any_returns_the_message_that_arrives_first) {
  // Rank 0 sends on tag 0 with a 200 ms link; the other receive gets a control message at once.
  Pair p(LinkModel{.latency_us = 200000, .bandwidth_mbps = 0});
  int v0 = 1, v1 = 2, g0 = 0, g1 = 0;
  const ConstSegment s0{&v0, sizeof v0}, s1{&v1, sizeof v1};
  const MutSegment r0{&g0, sizeof g0}, r1{&g1, sizeof g1};
  RequestId ids[2] = {must(p.b->irecv(0, Channel::kDispatch, 0, {&r0, 1})),
                      must(p.b->irecv(0, Channel::kControl, 0, {&r1, 1}))};
  must(p.a->isend(1, Channel::kDispatch, 0, {&s0, 1}));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the dispatch message has landed by now
  must(p.a->isend(1, Channel::kControl, 0, {&s1, 1}));
  Completion c;
  Result<int> first = p.b->wait_any(ids, deadline_after_ms(5000), &c);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(*first, 1);
  EXPECT_EQ(g1, 2);
  ids[1] = kNoRequest;
  Result<int> second = p.b->wait_any(ids, deadline_after_ms(5000), &c);
  ASSERT_TRUE(second.ok()) << second.status().to_string();
  EXPECT_EQ(*second, 0);
  EXPECT_EQ(g0, 1);
}

TEST(LinkTransport, a_peer_without_the_link_model_is_named_as_a_settings_mismatch) {
  Pair p(LinkModel{}, LinkModel{.latency_us = 100, .bandwidth_mbps = 0});
  int v = 1;
  int got[8] = {};
  const ConstSegment s{&v, sizeof v};
  const MutSegment r{got, sizeof got};
  RequestId rid = must(p.b->irecv(0, Channel::kDispatch, 0, {&r, 1}));
  must(p.a->isend(1, Channel::kDispatch, 0, {&s, 1}));
  Completion c;
  Result<int> w = p.b->wait_any({&rid, 1}, deadline_after_ms(5000), &c);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("every rank of the job must run the same link settings"), std::string::npos)
      << w.status().to_string();
}

TEST(LinkTransport, cancel_releases_a_posted_receive) {
  Pair p(LinkModel{.latency_us = 100, .bandwidth_mbps = 0});
  int got = 0;
  const MutSegment r{&got, sizeof got};
  RequestId rid = must(p.b->irecv(0, Channel::kDispatch, 0, {&r, 1}));
  EXPECT_TRUE(p.b->cancel(rid).ok());
  Completion c;
  EXPECT_FALSE(p.b->test(rid, &c).ok());  // the id is no longer in flight
}

}  // namespace
}  // namespace genbridge::afd
