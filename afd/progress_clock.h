#pragma once
// The clock of every AFD deadline (afd/transport.h): CLOCK_MONOTONIC less the time this whole process was
// paused (SIGSTOP until SIGCONT, a frozen container or VM, every thread starved of a core).
// docs/afd.md#deadlines-and-process-pauses says what it tells apart and where its limits are.
//
// Why: a deadline means "a peer owes this rank a message within timeout_ms". While the whole process is
// paused, every rank of an in-process job is paused with it and owes nothing; on resuming, a waiter that
// measured the pause as waiting time would blame a rank that is fine and end the job.
//
// How: a heartbeat thread (started on first use) wakes every kHeartbeatTickMs. The clock follows
// CLOCK_MONOTONIC but never runs more than kProcessStallMs ahead of the heartbeat's last tick; a gap between
// ticks longer than that is counted as paused, all but kProcessStallMs of it, and never reaches a deadline.
// Threads resume from a pause in any order: one that runs before the heartbeat sees the clock held at the
// last tick + kProcessStallMs, so no thread reads the pause as elapsed time. Under mpirun every process has
// its own clock: a paused or dead remote process does not hold this one, so its rank is still caught at the
// deadline (moved only by pauses of this process).

#include <chrono>
#include <cstdint>

namespace genbridge::afd {

inline constexpr int64_t kHeartbeatTickMs = 10;
inline constexpr int64_t kProcessStallMs = 100;

// The arithmetic of the clock, given CLOCK_MONOTONIC readings in ns (not thread-safe; ProgressClock locks).
class ProgressTime {
 public:
  explicit ProgressTime(int64_t start_ns, int64_t stall_ns = kProcessStallMs * 1'000'000)
      : last_tick_ns_(start_ns), stall_ns_(stall_ns) {}
  // The heartbeat ran at `monotonic_ns`: a gap since the last tick beyond stall_ns is paused time.
  void tick(int64_t monotonic_ns);
  // The clock at `monotonic_ns` (not before the last tick): monotonic_ns less the paused time, held at the
  // last tick + stall_ns while the heartbeat has not run since.
  int64_t now(int64_t monotonic_ns) const;
  int64_t paused_ns() const { return paused_ns_; }

 private:
  int64_t last_tick_ns_;
  const int64_t stall_ns_;
  int64_t paused_ns_ = 0;
};

// A std::chrono clock (steady) over this process's ProgressTime.
struct ProgressClock {
  using rep = int64_t;
  using period = std::nano;
  using duration = std::chrono::nanoseconds;
  using time_point = std::chrono::time_point<ProgressClock>;
  static constexpr bool is_steady = true;
  // Starts the heartbeat thread on first use (a detached thread that lives as long as the process; in a child
  // of fork(), on the child's first use).
  static time_point now();
  // Time this process has been found paused since the heartbeat started (for the log and tests).
  static duration paused();
};

}  // namespace genbridge::afd
