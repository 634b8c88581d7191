#include "tools/serve/http_connection.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "tools/serve/http_server.h"

namespace genbridge::serve {

namespace {

thread_local Connection* t_connection = nullptr;

// How long the connection loop waits at a time (for the next request, for a drain), so a stopped server's
// workers notice the stop promptly.
constexpr auto kPollSlice = std::chrono::milliseconds(50);
// Requests after which an idle server returns freed memory even if none of them was large.
constexpr int kTrimAfterRequests = 16;

void endpoint(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ip.clear();
  port = -1;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
    port = ntohs(v6->sin6_port);
  }
  ip = text;
}

// Whether `text` is a non-empty run of decimal digits that fits 64 bits.
bool parse_length(const std::string& text, uint64_t* out) {
  if (text.empty() || text.size() > 19) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  *out = v;
  return true;
}

std::string mib(size_t bytes) {
  if (bytes % (size_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  return fmt::format("{} bytes", bytes);
}

// Returns what the allocator holds free to the system (glibc keeps freed memory in per-thread arenas and
// below the top of each heap; malloc_trim(0) releases every free page of every arena).
void return_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace

Connection* current_connection() { return t_connection; }

void tune_allocator_for_serving() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMmapThresholdBytes));
  mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThresholdBytes));
#endif
}

ConnectionStream::ConnectionStream(int fd, std::chrono::microseconds read_timeout,
                                   std::chrono::microseconds write_timeout)
    : fd_(fd), read_timeout_(read_timeout), write_timeout_(write_timeout), buf_(16 << 10, '\0') {}

bool ConnectionStream::wait(short events, std::chrono::microseconds timeout) const {
  pollfd p{.fd = fd_, .events = events, .revents = 0};
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (rc > 0) return true;  // ready, or an error / hang-up the next call reports
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool ConnectionStream::is_readable() const { return off_ < len_ || wait(POLLIN, read_timeout_); }

bool ConnectionStream::is_writable() const { return wait(POLLOUT, write_timeout_); }

void ConnectionStream::set_budget(size_t bytes) {
  budget_ = bytes;
  exhausted_ = false;
}

void ConnectionStream::begin_request(size_t budget, std::chrono::steady_clock::time_point head_deadline) {
  set_budget(budget);
  read_ = written_ = 0;
  deadline_ = head_deadline;
  timed_out_ = false;
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (size == 0) return 0;
  if (budget_ == 0) {
    exhausted_ = true;
    return -1;
  }
  size = std::min(size, budget_);
  if (off_ == len_) {
    auto timeout = read_timeout_;
    if (deadline_ != std::chrono::steady_clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - std::chrono::steady_clock::now());
      timeout = std::min(timeout, std::max(left, std::chrono::microseconds(0)));
    }
    if (!wait(POLLIN, timeout)) {
      if (std::chrono::steady_clock::now() >= deadline_) timed_out_ = true;
      return -1;
    }
    ssize_t n;
    do {
      n = ::recv(fd_, buf_.data(), buf_.size(), 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return n;  // 0: the client closed its side
    off_ = 0;
    len_ = static_cast<size_t>(n);
  }
  const size_t n = std::min(size, len_ - off_);
  std::memcpy(ptr, buf_.data() + off_, n);
  off_ += n;
  budget_ -= n;
  read_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  ssize_t n;
  do {
    n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n > 0) written_ += static_cast<size_t>(n);
  return n;
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const { endpoint(fd_, true, ip, port); }
void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const { endpoint(fd_, false, ip, port); }

bool ConnectionStream::wait_next(std::chrono::milliseconds timeout, const std::atomic<socket_t>& listener) const {
  if (off_ < len_) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (listener != INVALID_SOCKET) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::milliseconds(0)) return false;
    if (wait(POLLIN, std::min<std::chrono::microseconds>(std::chrono::duration_cast<std::chrono::microseconds>(left),
                                                         kPollSlice))) {
      return true;
    }
  }
  return false;
}

bool ConnectionStream::peer_shut_write() const {
  pollfd p{.fd = fd_, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

WireServer::WireServer(WireLimits limits) : limits_(limits) {
  set_payload_max_length(limits_.max_body_bytes);
  // After the head: the body's budget (chunked framing may add as much again), and the refusals that need
  // no body.
  set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    Connection* c = current_connection();
    if (c) c->routed = true;
    if (c && c->stream) {
      c->stream->set_budget(2 * limits_.max_body_bytes + kMaxRequestHeadBytes);
      c->stream->end_head();
    }
    if (refuse_before_body(req, res)) return HandlerResponse::Handled;
    if (gate_ && gate_(req, res)) {
      const std::string length = req.get_header_value("Content-Length");
      if (c && (req.has_header("Transfer-Encoding") || (!length.empty() && length != "0"))) {
        c->close_after_response = true;  // its body is never read
      }
      return HandlerResponse::Handled;
    }
    return HandlerResponse::Unhandled;
  });
  // "Expect: 100-continue": a body that would be refused is never asked for.
  set_expect_100_continue_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (auto status = refuse_before_body(req, res)) return *status;
    return 100;
  });
  set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (response_hook_) response_hook_(req, res);
    Connection* c = current_connection();
    if (!c || !c->close_after_response) return;
    res.headers.erase("Keep-Alive");
    res.set_header("Connection", "close");
  });
}

void WireServer::post_with_body(const std::string& path, HandlerWithContentReader handler) {
  body_paths_.push_back(path);
  Post(path, std::move(handler));
}

std::optional<int> WireServer::refuse_before_body(const httplib::Request& req, httplib::Response& res) const {
  Connection* c = current_connection();
  auto refuse = [&](int status, std::string why) -> std::optional<int> {
    res.status = status;
    if (c) {
      c->refusal = std::move(why);
      c->close_after_response = true;
    }
    return status;
  };
  const bool has_length = req.has_header("Content-Length");
  const bool has_coding = req.has_header("Transfer-Encoding");
  if (req.get_header_value_count("Content-Length") > 1 || req.get_header_value_count("Transfer-Encoding") > 1) {
    return refuse(400, "The request repeats Content-Length or Transfer-Encoding.");
  }
  if (has_coding && strcasecmp(req.get_header_value("Transfer-Encoding").c_str(), "chunked") != 0) {
    return refuse(501, fmt::format("Transfer-Encoding '{}' is not supported; this server reads 'chunked' bodies only.",
                                   req.get_header_value("Transfer-Encoding")));
  }
  if (has_coding && has_length) {
    return refuse(400, "The request has both Content-Length and Transfer-Encoding; send one of them.");
  }
  uint64_t length = 0;
  if (has_length && !parse_length(req.get_header_value("Content-Length"), &length)) {
    return refuse(400, fmt::format("Content-Length '{}' is not a byte count.", req.get_header_value("Content-Length")));
  }
  if (length > limits_.max_body_bytes) {
    return refuse(413, fmt::format("The request body is {} bytes; this server takes at most {} (--max-body-mb).",
                                   length, mib(limits_.max_body_bytes)));
  }
  const bool has_body = has_coding || length > 0;
  const bool body_route =
      req.method == "POST" && std::find(body_paths_.begin(), body_paths_.end(), req.path) != body_paths_.end();
  if (has_body && !body_route) {
    // A body nothing reads is never read: a method that carries one (cpp-httplib would read it whole before
    // routing) is answered at once, any other request as usual; the connection closes after the response.
    const bool carries_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                              req.method == "DELETE" || req.method == "PRI";
    if (carries_body) return refuse(404, fmt::format("No route {} {}.", req.method, req.path));
    if (c) c->close_after_response = true;
  }
  return std::nullopt;
}

std::optional<BodyRefusal> WireServer::read_body(const httplib::Request& req, const httplib::ContentReader& reader,
                                                 std::string* body) const {
  body->clear();
  Connection* c = current_connection();
  const bool chunked = req.has_header("Transfer-Encoding");  // refuse_before_body took "chunked" only
  if (!chunked && !req.has_header("Content-Length")) return std::nullopt;
  const size_t max = limits_.max_body_bytes;
  if (!chunked) body->reserve(static_cast<size_t>(req.get_header_value<uint64_t>("Content-Length")));
  bool too_large = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (n > max - std::min(max, body->size())) {
      too_large = true;
      return false;
    }
    body->append(data, n);
    return true;
  });
  if (ok) return std::nullopt;
  if (c) c->close_after_response = true;
  body->clear();
  body->shrink_to_fit();
  if (too_large) {
    return BodyRefusal{413, fmt::format("The request body exceeds {}, this server's limit (--max-body-mb); it was "
                                        "refused while being read.",
                                        mib(max))};
  }
  if (c && c->stream && c->stream->budget_exhausted()) {
    return BodyRefusal{413, fmt::format("The request's chunked framing exceeds {} in all (the body's limit, "
                                        "--max-body-mb, plus as much framing); send larger chunks.",
                                        mib(2 * max + kMaxRequestHeadBytes))};
  }
  return BodyRefusal{400,
                     "The request body could not be read: it ended early, its chunked framing is malformed, "
                     "or it did not arrive within the read timeout."};
}

bool WireServer::process_and_close_socket(socket_t sock) {
  ConnectionStream strm(sock, std::chrono::seconds(read_timeout_sec_) + std::chrono::microseconds(read_timeout_usec_),
                        std::chrono::seconds(write_timeout_sec_) + std::chrono::microseconds(write_timeout_usec_));
  Connection conn{.fd = sock, .stream = &strm};
  Connection* const outer = t_connection;
  t_connection = &conn;
  bool ret = false;
  size_t count = keep_alive_max_count_;
  while (svr_sock_ != INVALID_SOCKET && count > 0 &&
         strm.wait_next(std::chrono::seconds(keep_alive_timeout_sec_), svr_sock_)) {
    conn.close_after_response = false;
    conn.refusal.clear();
    conn.routed = false;
    strm.begin_request(kMaxRequestHeadBytes, std::chrono::steady_clock::now() + kMaxRequestHeadTime);
    bool connection_closed = false;
    ++in_flight_;
    ret = process_request(strm, count == 1, connection_closed, nullptr);
    --in_flight_;
    if (!ret && strm.bytes_written() == 0 && (strm.budget_exhausted() || strm.head_timed_out())) {
      // The request line alone ran past the head's budget or deadline: cpp-httplib gives up without a
      // response.
      const bool slow = strm.head_timed_out();
      const std::string body = fmt::format(
          "{{\"error\":{{\"message\":\"{}\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}}}\n",
          slow ? fmt::format("The request's head did not arrive within {} s, this server's limit.",
                             kMaxRequestHeadTime.count())
               : fmt::format("The request line exceeds {} bytes, this server's limit for a request's head.",
                             kMaxRequestHeadBytes));
      const std::string head = fmt::format(
          "HTTP/1.1 {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
          slow ? "408 Request Timeout" : "431 Request Header Fields Too Large", body.size());
      (void)(strm.write(head.data(), head.size()) > 0 && strm.write(body.data(), body.size()) > 0);
      conn.close_after_response = true;
    }
    request_ended(strm);
    if (strm.budget_exhausted() || strm.head_timed_out()) conn.close_after_response = true;
    if (!ret || connection_closed || conn.close_after_response) break;
    --count;
  }
  t_connection = outer;
  // Closing with input unread (a refused body; requests pipelined past the last one answered) would reset
  // the connection and could lose the response: shut this side first, then read and drop what the client
  // still sends until it closes, for at most kLingerTimeout.
  ::shutdown(sock, SHUT_WR);
  if (conn.close_after_response || count == 0 || strm.buffered()) {
    const auto deadline = std::chrono::steady_clock::now() + kLingerTimeout;
    char scratch[4096];
    while (svr_sock_ != INVALID_SOCKET && std::chrono::steady_clock::now() < deadline) {
      pollfd p{.fd = sock, .events = POLLIN, .revents = 0};
      const int rc = ::poll(&p, 1, static_cast<int>(kPollSlice.count()));
      if (rc <= 0) continue;  // nothing yet, or EINTR
      const ssize_t n = ::recv(sock, scratch, sizeof scratch, 0);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
  }
  ::close(sock);
  return ret;
}

void WireServer::request_ended(const ConnectionStream& strm) {
  // The request's Request and Response are gone by now (process_request's locals).
  const int since = since_trim_.fetch_add(1) + 1;
  if (strm.bytes_read() >= kTrimAfterRequestBytes || (since >= kTrimAfterRequests && in_flight_.load() == 0)) {
    since_trim_ = 0;
    return_free_memory();
  }
}

}  // namespace genbridge::serve
