#include "runtime/engine/step_trace.h"

#include <fmt/format.h>

#include "runtime/trace/chrome_trace.h"

namespace genbridge::engine {

StepTrace::StepTrace(size_t max_events) : capacity_(max_events) { events_.reserve(max_events); }

void StepTrace::add(model::ForwardPhase phase, int64_t layer, int64_t step, int64_t begin_ns, int64_t end_ns) {
  if (events_.size() >= capacity_) {
    ++dropped_;
    return;
  }
  events_.push_back(Event{begin_ns, end_ns, step, static_cast<int32_t>(layer), phase});
}

std::string StepTrace::json() const {
  runtime::ChromeTraceWriter w(events_.empty() ? 0 : events_.front().begin_ns);
  constexpr int kPid = 0;
  w.process(kPid, "monolithic engine");
  for (int p = 0; p < model::kNumForwardPhases; ++p) {
    w.thread(kPid, p, model::forward_phase_name(static_cast<model::ForwardPhase>(p)));
  }
  for (const Event& e : events_) {
    const char* name = model::forward_phase_name(e.phase);
    w.span(e.layer >= 0 ? fmt::format("{} L{}", name, e.layer) : std::string(name), name, kPid,
           static_cast<int>(e.phase), e.begin_ns, e.end_ns,
           fmt::format("{{\"layer\":{},\"step\":{}}}", e.layer, e.step));
  }
  return w.finish();
}

Status StepTrace::write(const std::string& path) const { return runtime::write_trace_file(path, json()); }

}  // namespace genbridge::engine
