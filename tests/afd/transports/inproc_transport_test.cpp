// The in-process transport's MPI-like semantics: ordering, wildcards, scatter/gather segments,
// truncation, deadlines, failure propagation and close.

#include "afd/transports/inproc/inproc_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace genbridge::afd {
namespace {

struct Pair {
  std::shared_ptr<InprocWorld> world = make_inproc_world(2, 5000);
  std::unique_ptr<Transport> a = make_inproc_transport(world, 0);
  std::unique_ptr<Transport> b = make_inproc_transport(world, 1);
  Pair() {
    std::thread t([&] { EXPECT_TRUE(b->init().ok()); });
    EXPECT_TRUE(a->init().ok());
    t.join();
  }
};

Deadline soon() { return deadline_after_ms(2000); }

RequestId must(Result<RequestId> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r.value() : kNoRequest;
}

TEST(InprocTransport, messages_on_one_tag_arrive_in_send_order) {
  Pair p;
  int v[3] = {10, 20, 30};
  RequestId s[3];
  for (int i = 0; i < 3; ++i) {
    const ConstSegment seg{&v[i], sizeof(int)};
    s[i] = must(p.a->isend(1, Channel::kDispatch, 7, {&seg, 1}));
  }
  for (int i = 0; i < 3; ++i) {
    int got = 0;
    const MutSegment seg{&got, sizeof(int)};
    RequestId r = must(p.b->irecv(0, Channel::kDispatch, 7, {&seg, 1}));
    Completion c;
    ASSERT_TRUE(p.b->wait_any({&r, 1}, soon(), &c).ok());
    EXPECT_EQ(got, v[i]);
    EXPECT_EQ(c.source, 0);
    EXPECT_EQ(c.tag, 7);
    EXPECT_EQ(c.bytes, sizeof(int));
  }
  for (RequestId& id : s) ASSERT_TRUE(p.a->wait_any({&id, 1}, soon(), nullptr).ok());
}

TEST(InprocTransport, any_source_and_any_tag_match_and_channels_are_separate) {
  Pair p;
  int x = 5, y = 6;
  const ConstSegment sx{&x, 4}, sy{&y, 4};
  RequestId s1 = must(p.a->isend(1, Channel::kControl, 3, {&sx, 1}));
  RequestId s2 = must(p.a->isend(1, Channel::kCombine, 4, {&sy, 1}));
  int got = 0;
  const MutSegment g{&got, 4};
  RequestId r = must(p.b->irecv(kAnySource, Channel::kCombine, kAnyTag, {&g, 1}));
  Completion c;
  ASSERT_TRUE(p.b->wait_any({&r, 1}, soon(), &c).ok());
  EXPECT_EQ(got, 6);
  EXPECT_EQ(c.tag, 4);
  r = must(p.b->irecv(kAnySource, Channel::kControl, kAnyTag, {&g, 1}));
  ASSERT_TRUE(p.b->wait_any({&r, 1}, soon(), &c).ok());
  EXPECT_EQ(got, 5);
  ASSERT_TRUE(p.a->wait_any({&s1, 1}, soon(), nullptr).ok());
  ASSERT_TRUE(p.a->wait_any({&s2, 1}, soon(), nullptr).ok());
}

TEST(InprocTransport, segments_gather_on_send_and_scatter_on_receive) {
  Pair p;
  const char a[] = "abc", b[] = "defgh";
  const ConstSegment send[2] = {{a, 3}, {b, 5}};
  char x[2] = {}, y[6] = {};
  const MutSegment recv[2] = {{x, 2}, {y, 6}};
  RequestId r = must(p.b->irecv(0, Channel::kDispatch, 0, recv));  // posted first: the sender copies
  RequestId s = must(p.a->isend(1, Channel::kDispatch, 0, send));
  Completion c;
  ASSERT_TRUE(p.b->wait_any({&r, 1}, soon(), &c).ok());
  EXPECT_EQ(c.bytes, 8u);
  EXPECT_EQ(std::string(x, 2), "ab");
  EXPECT_EQ(std::string(y, 6), std::string("cdefgh"));
  ASSERT_TRUE(p.a->wait_any({&s, 1}, soon(), nullptr).ok());
}

TEST(InprocTransport, message_longer_than_the_receive_is_an_error) {
  Pair p;
  char big[16] = {};
  char small[8];
  const ConstSegment s{big, 16};
  const MutSegment r{small, 8};
  RequestId sid = must(p.a->isend(1, Channel::kDispatch, 0, {&s, 1}));
  RequestId rid = must(p.b->irecv(0, Channel::kDispatch, 0, {&r, 1}));
  Result<int> w = p.b->wait_any({&rid, 1}, soon(), nullptr);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("does not fit"), std::string::npos) << w.status().message();
  ASSERT_TRUE(p.a->wait_any({&sid, 1}, soon(), nullptr).ok());
}

TEST(InprocTransport, wait_ends_at_the_deadline) {
  Pair p;
  int v;
  const MutSegment r{&v, 4};
  RequestId rid = must(p.b->irecv(0, Channel::kDispatch, 0, {&r, 1}));
  const auto t0 = Clock::now();
  Result<int> w = p.b->wait_any({&rid, 1}, deadline_after_ms(50), nullptr);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  ASSERT_EQ(w.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(ms, 45);
  EXPECT_LT(ms, 1000);
  ASSERT_TRUE(p.b->cancel(rid).ok());
}

TEST(InprocTransport, a_failed_rank_ends_every_wait_at_once_naming_it) {
  Pair p;
  p.a->set_rank_names({"attention rank 0 (world rank 0)", "ffn rank 0 (world rank 1)"});
  int v;
  const MutSegment r{&v, 4};
  RequestId rid = must(p.a->irecv(1, Channel::kCombine, 0, {&r, 1}));
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    p.b->abort_job(internal_error("boom"));
  });
  const auto t0 = Clock::now();
  Result<int> w = p.a->wait_any({&rid, 1}, deadline_after_ms(10000), nullptr);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  killer.join();
  ASSERT_EQ(w.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(w.status().message(), "ffn rank 0 (world rank 1) failed: Internal: boom");
  EXPECT_LT(ms, 2000);
  EXPECT_EQ(world_failure(*p.world).message(), "ffn rank 0 (world rank 1) failed: Internal: boom");
}

TEST(InprocTransport, close_unblocks_and_rejects_later_calls) {
  Pair p;
  ASSERT_TRUE(p.b->close().ok());
  int v = 0;
  const ConstSegment s{&v, 4};
  EXPECT_EQ(p.b->isend(0, Channel::kControl, 0, {&s, 1}).status().code(), StatusCode::kUnavailable);
  ASSERT_TRUE(p.b->close().ok());  // idempotent
}

TEST(InprocTransport, init_waits_for_every_rank_then_times_out) {
  auto world = make_inproc_world(2, 50);
  auto a = make_inproc_transport(world, 0);
  const Status s = a->init();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "inproc transport: world rank 0 waited 50 ms for 1 of 2 ranks to join");
}

}  // namespace
}  // namespace genbridge::afd
