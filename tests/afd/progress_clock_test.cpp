// The deadline clock (afd/progress_clock.h): its arithmetic on given CLOCK_MONOTONIC readings, and a real
// process paused with SIGSTOP: an in-process wait whose peer answers after the pause gets the message, and
// a peer that never answers is still caught at the deadline.

#include "afd/progress_clock.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "afd/transport.h"
#include "afd/transports/inproc/inproc_transport.h"

namespace genbridge::afd {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(ProgressTime, follows_the_monotonic_clock_while_the_heartbeat_ticks) {
  ProgressTime t(1000 * kMs, 100 * kMs);
  for (int64_t ms = 1010; ms <= 2000; ms += 10) {
    t.tick(ms * kMs);
    EXPECT_EQ(t.now(ms * kMs + 5 * kMs), ms * kMs + 5 * kMs);
  }
  EXPECT_EQ(t.paused_ns(), 0);
}

TEST(ProgressTime, a_gap_between_ticks_beyond_the_stall_limit_is_paused_time) {
  ProgressTime t(1000 * kMs, 100 * kMs);
  t.tick(1010 * kMs);
  t.tick(4010 * kMs);  // 3 s without a tick: all but 100 ms of it paused
  EXPECT_EQ(t.paused_ns(), 2900 * kMs);
  EXPECT_EQ(t.now(4020 * kMs), 1120 * kMs);
}

TEST(ProgressTime, a_reader_before_the_heartbeat_sees_the_clock_held_and_it_never_goes_back) {
  ProgressTime t(1000 * kMs, 100 * kMs);
  t.tick(1010 * kMs);
  // Resumed after a pause: a reader that runs before the heartbeat sees at most the last tick + 100 ms.
  const int64_t held = t.now(5000 * kMs);
  EXPECT_EQ(held, 1110 * kMs);
  t.tick(5001 * kMs);
  EXPECT_EQ(t.now(5001 * kMs), held);  // continuous across the tick
  EXPECT_EQ(t.now(5051 * kMs), held + 50 * kMs);
}

TEST(ProgressClock, advances_with_real_time) {
  const auto t0 = ProgressClock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(ProgressClock::now() - t0).count();
  EXPECT_GE(ms, 55);
  EXPECT_LT(ms, 5000);
}

// In a child process: world rank 1 waits for a message from world rank 0 with a `deadline_ms` deadline;
// rank 0 sends it `send_after_ms` + 50 ms after the start (never when negative). The parent pauses the child for
// `pause_ms` right after it started waiting. Exit status: 0 received, 3 DeadlineExceeded, 4 other error.
// *waited_ms: how long the wait took on the parent's clock.
int paused_child(int64_t deadline_ms, int64_t send_after_ms, int64_t pause_ms, int64_t* waited_ms) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    std::shared_ptr<InprocWorld> world = make_inproc_world(2, 5000);
    std::unique_ptr<Transport> a = make_inproc_transport(world, 0);
    std::unique_ptr<Transport> b = make_inproc_transport(world, 1);
    std::thread init([&] { (void)b->init(); });
    if (!a->init().ok()) _exit(5);
    init.join();
    int v = 7, got = 0;
    const MutSegment in{&got, sizeof got};
    Result<RequestId> rid = b->irecv(0, Channel::kControl, 1, {&in, 1});
    if (!rid.ok()) _exit(5);
    std::thread sender([&] {
      if (send_after_ms < 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(send_after_ms));
      // A second sleep, which starts only after a pause ended: the answer comes 50 ms after the resume.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const ConstSegment out{&v, sizeof v};
      (void)a->isend(1, Channel::kControl, 1, {&out, 1});
    });
    const RequestId id = rid.value();
    const Deadline deadline = deadline_after_ms(deadline_ms);
    const char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(5);
    Result<int> w = b->wait_any({&id, 1}, deadline, nullptr);
    const int code = w.ok() && got == 7 ? 0 : (w.status().code() == StatusCode::kDeadlineExceeded ? 3 : 4);
    _exit(code);  // the sender may still sleep (a peer that never answers): no joins
  }
  close(ready[1]);
  char c = 0;
  const bool started = read(ready[0], &c, 1) == 1;
  close(ready[0]);
  if (started && pause_ms > 0) {
    kill(pid, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    kill(pid, SIGCONT);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  *waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ProgressClock, a_pause_of_the_whole_process_longer_than_the_deadline_is_not_a_dead_peer) {
  int64_t waited = 0;
  // The wait's deadline is 400 ms; the process is paused for 1.5 s; the peer answers 200 ms after the start.
  EXPECT_EQ(paused_child(400, 200, 1500, &waited), 0) << "waited " << waited << " ms";
  EXPECT_GE(waited, 1500);
}

TEST(ProgressClock, a_peer_that_never_answers_is_still_caught_at_the_deadline) {
  int64_t waited = 0;
  EXPECT_EQ(paused_child(400, -1, 0, &waited), 3);
  EXPECT_LT(waited, 400 + 1500);  // the deadline plus start-up, not a hang
  // Paused for 1 s: caught at the deadline on the progress clock (the pause is not counted).
  EXPECT_EQ(paused_child(400, -1, 1000, &waited), 3);
  EXPECT_GE(waited, 1000 + 300);
  EXPECT_LT(waited, 1000 + 400 + 1500);
}

}  // namespace
}  // namespace genbridge::afd
