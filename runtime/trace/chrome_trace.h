#pragma once
// The Chrome/Perfetto trace format ("traceEvents" JSON, complete events in microseconds), written the same
// way for every trace genbridge produces: the monolithic engine's steps (runtime/engine/step_trace.h) and
// the ranks of an AFD job (afd/metrics.h). Load the file in chrome://tracing or ui.perfetto.dev.

#include <cstdint>
#include <string>
#include <string_view>

#include "genbridge/core/status.h"

namespace genbridge::runtime {

class ChromeTraceWriter {
 public:
  // Timestamps are steady-clock nanoseconds; the trace shows them relative to `origin_ns`.
  explicit ChromeTraceWriter(int64_t origin_ns) : origin_ns_(origin_ns) {}
  // Names a process (a row group) or one of its threads (a row).
  void process(int pid, std::string_view name);
  void thread(int pid, int tid, std::string_view name);
  // One span [begin_ns, end_ns] named `name` in category `category`; `args_json` is a JSON object's text
  // (e.g. {"layer":3}) shown with the span.
  void span(std::string_view name, std::string_view category, int pid, int tid, int64_t begin_ns, int64_t end_ns,
            std::string_view args_json);
  // The trace's JSON text.
  std::string finish();

 private:
  void separator();
  int64_t origin_ns_;
  std::string out_ = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
  bool first_ = true;
};

// Writes `text` to `path` as every output file is written (runtime/engine/npy.h: a temporary file renamed
// on success; devices and FIFOs directly); errors read "--trace <path>: <reason>".
Status write_trace_file(const std::string& path, std::string_view text);

}  // namespace genbridge::runtime
