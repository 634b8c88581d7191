#pragma once
// StepTrace: the monolithic engine's timeline for `genbridge run --trace FILE.json`: every phase of every
// forward (embed, attention, route, experts, combine, logits, per layer) as a span, in the Chrome/Perfetto
// format of the AFD traces (runtime/trace/chrome_trace.h). One row per phase kind.

#include <cstdint>
#include <string>
#include <vector>

#include "genbridge/core/status.h"
#include "runtime/forward/runner.h"

namespace genbridge::engine {

class StepTrace {
 public:
  // Reserves `max_events` spans up front; beyond that, spans are counted as dropped (the decode loop does
  // not allocate for the trace).
  explicit StepTrace(size_t max_events = size_t{1} << 20);
  // One phase of forward number `step` (from 1).
  void add(model::ForwardPhase phase, int64_t layer, int64_t step, int64_t begin_ns, int64_t end_ns);
  size_t size() const { return events_.size(); }
  int64_t dropped() const { return dropped_; }
  std::string json() const;
  // Writes json() to `path`; Unavailable naming the path on failure.
  Status write(const std::string& path) const;

 private:
  struct Event {
    int64_t begin_ns, end_ns, step;
    int32_t layer;
    model::ForwardPhase phase;
  };
  std::vector<Event> events_;
  size_t capacity_;
  int64_t dropped_ = 0;
};

}  // namespace genbridge::engine
