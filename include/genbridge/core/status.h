#pragma once
// Status / Result<T>: errors are data inside the library (docs/design.md#conventions).

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace genbridge {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kUnimplemented,
  kUnavailable,
  kResourceExhausted,
  kDeadlineExceeded,
  kInternal,
};

// Returns the code's name as written in messages, e.g. "InvalidArgument".
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: <message>", or "OK".
  std::string to_string() const;

  // Marks an intentionally ignored status.
  void ignore() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
inline Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status deadline_exceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or an error Status (never an OK status without a value).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) {
      v_ = Status(StatusCode::kInternal, "Result constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return checked(); }
  const T& value() const& { return const_cast<Result*>(this)->checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &const_cast<Result*>(this)->checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return const_cast<Result*>(this)->checked(); }
  T&& operator*() && { return std::move(checked()); }

 private:
  T& checked() {
    if (!ok()) {
      std::fprintf(stderr, "genbridge: Result::value() on error: %s\n", std::get<Status>(v_).to_string().c_str());
      std::abort();
    }
    return std::get<T>(v_);
  }
  std::variant<T, Status> v_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* msg);

}  // namespace genbridge

#define GB_CONCAT_INNER(a, b) a##b
#define GB_CONCAT(a, b) GB_CONCAT_INNER(a, b)

// Propagates a non-OK Status.
#define GB_RETURN_IF_ERROR(expr)                     \
  do {                                               \
    ::genbridge::Status gb_status_ = (expr);         \
    if (!gb_status_.ok()) return gb_status_;         \
  } while (0)

// `GB_ASSIGN_OR_RETURN(auto x, make_x());`
#define GB_ASSIGN_OR_RETURN(lhs, expr) GB_ASSIGN_OR_RETURN_IMPL(GB_CONCAT(gb_result_, __LINE__), lhs, expr)
#define GB_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

// Always-on invariant check: aborts with file:line. For broken invariants, never for bad input.
#define GB_CHECK(cond, msg)                                                    \
  do {                                                                         \
    if (!(cond)) ::genbridge::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
