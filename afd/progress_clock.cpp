#include "afd/progress_clock.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace genbridge::afd {

void ProgressTime::tick(int64_t monotonic_ns) {
  const int64_t gap = monotonic_ns - last_tick_ns_;
  if (gap > stall_ns_) paused_ns_ += gap - stall_ns_;
  last_tick_ns_ = std::max(last_tick_ns_, monotonic_ns);
}

int64_t ProgressTime::now(int64_t monotonic_ns) const {
  return std::min(monotonic_ns, last_tick_ns_ + stall_ns_) - paused_ns_;
}

namespace {

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The process's clock: readers and the heartbeat take the mutex and read CLOCK_MONOTONIC under it, so
// every reading is ordered with the ticks and the clock never goes back.
struct ProcessClock {
  std::mutex mu;
  ProgressTime time{monotonic_ns()};
  // A child of fork() has no heartbeat thread: without a new one its clock would stop kProcessStallMs
  // after the fork and no deadline would pass. The first reading in the child starts one.
  std::atomic<bool> needs_heartbeat{true};
};

ProcessClock* the_clock = nullptr;  // set once, never destroyed (the detached heartbeat uses it until exit)

void start_heartbeat(ProcessClock* c) {
  std::thread([c] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(kHeartbeatTickMs));
      std::lock_guard lock(c->mu);
      c->time.tick(monotonic_ns());
    }
  }).detach();
}

ProcessClock& process_clock() {
  static ProcessClock* clock = [] {
    the_clock = new ProcessClock;
    // fork() while another thread holds the mutex would leave it held forever in the child.
    pthread_atfork([] { the_clock->mu.lock(); }, [] { the_clock->mu.unlock(); },
                   [] {
                     the_clock->mu.unlock();
                     the_clock->needs_heartbeat = true;
                   });
    return the_clock;
  }();
  if (clock->needs_heartbeat.load(std::memory_order_relaxed) && clock->needs_heartbeat.exchange(false)) {
    start_heartbeat(clock);
  }
  return *clock;
}

}  // namespace

ProgressClock::time_point ProgressClock::now() {
  ProcessClock& c = process_clock();
  std::lock_guard lock(c.mu);
  return time_point(duration(c.time.now(monotonic_ns())));
}

ProgressClock::duration ProgressClock::paused() {
  ProcessClock& c = process_clock();
  std::lock_guard lock(c.mu);
  return duration(c.time.paused_ns());
}

}  // namespace genbridge::afd
