#include "genbridge/core/status.h"

namespace genbridge {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code_)) + ": " + message_;
}

void check_failed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "genbridge: check failed at %s:%d: %s (%s)\n", file, line, expr, msg);
  std::abort();
}

}  // namespace genbridge
