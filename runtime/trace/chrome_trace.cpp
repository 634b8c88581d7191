#include "runtime/trace/chrome_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "runtime/engine/npy.h"

namespace genbridge::runtime {

void ChromeTraceWriter::separator() {
  if (!first_) out_ += ",\n";
  first_ = false;
}

void ChromeTraceWriter::process(int pid, std::string_view name) {
  separator();
  out_ += fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"{}\"}}}}", pid, name);
}

void ChromeTraceWriter::thread(int pid, int tid, std::string_view name) {
  separator();
  out_ += fmt::format("{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}",
                      pid, tid, name);
}

void ChromeTraceWriter::span(std::string_view name, std::string_view category, int pid, int tid, int64_t begin_ns,
                             int64_t end_ns, std::string_view args_json) {
  separator();
  out_ += fmt::format(
      "{{\"name\":\"{}\",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f},\"args\":{}}}",
      name, category, pid, tid, static_cast<double>(begin_ns - origin_ns_) * 1e-3,
      static_cast<double>(std::max<int64_t>(0, end_ns - begin_ns)) * 1e-3, args_json);
}

std::string ChromeTraceWriter::finish() {
  std::string out = std::move(out_);
  out += "]}\n";
  out_.clear();
  return out;
}

Status write_trace_file(const std::string& path, std::string_view text) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()), text.size());
  return engine::write_output_file("--trace", path, std::span<const std::span<const std::byte>>(&bytes, 1));
}

}  // namespace genbridge::runtime
