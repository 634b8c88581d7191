#pragma once
// The connection side of `genbridge serve`'s HTTP/1.1 (docs/serving.md, "Limits"): cpp-httplib 0.11's
// httplib::Server with its per-connection loop replaced by one that
//   - keeps one buffered stream per connection, so requests that arrive together (pipelining) are each read
//     and answered in order (0.11 makes a new stream per request and drops the bytes its buffer held);
//   - writes whenever the socket has room, also to a client that half-closed its side after sending its
//     request (shutdown(SHUT_WR)): 0.11 refuses to write once the peer's FIN has arrived;
//   - bounds what each request may read while it is read: its head (request line and headers) to
//     kMaxRequestHeadBytes arriving within kMaxRequestHeadTime, its body to the body limit however it is framed
//     (Content-Length, chunked), with room for chunked framing; a request past a bound is answered (431 / 408 / 413)
//     and its connection closed;
//   - closes a connection that still has unread input gracefully (its side shut first, the rest drained for
//     at most kLingerTimeout), so the client reads the response instead of a reset;
//   - returns freed memory to the system after requests with large bodies and whenever the server falls
//     idle (malloc_trim), so bursts of large or refused requests do not leave the process larger.
// Handlers reach the connection they serve through current_connection() (same thread).

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace genbridge::serve {

// Bytes of one request's head: the request line and every header line with their line ends.
constexpr size_t kMaxRequestHeadBytes = size_t{64} << 10;
// A request's head must arrive whole within this long of its first byte (a client trickling its headers
// would hold an HTTP thread for as long as it likes).
constexpr auto kMaxRequestHeadTime = std::chrono::seconds(10);
// A connection closed with input still unread drains it for at most this long after shutting its side.
constexpr auto kLingerTimeout = std::chrono::seconds(1);
// A request that read at least this many bytes has its freed memory returned to the system when it ends.
constexpr size_t kTrimAfterRequestBytes = size_t{1} << 20;

class ConnectionStream;

// The allocator's thresholds while serving (tune_allocator_for_serving(), tools/serve/http_server.h).
constexpr size_t kMmapThresholdBytes = size_t{1} << 20;
constexpr size_t kTrimThresholdBytes = size_t{1} << 20;

// The connection the calling thread serves, while a request is processed on it.
struct Connection {
  int fd = -1;
  ConnectionStream* stream = nullptr;
  // The rest of the input cannot be read as requests (a refused or broken body, or a body never read): the
  // response says "Connection: close" and the connection closes after it.
  bool close_after_response = false;
  // Why a request was refused before a handler saw it (the error handler's message); empty: none.
  std::string refusal;
  // Whether the request's head was read whole and routed (false: a malformed or oversized head).
  bool routed = false;
};
// nullptr outside a request being processed.
Connection* current_connection();

// A connection's socket as cpp-httplib's Stream: buffered reads under a per-request byte budget, writes
// that need only room in the send buffer. Not thread-safe: used by the thread serving the connection.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, std::chrono::microseconds read_timeout, std::chrono::microseconds write_timeout);
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

  // The bytes the current request may still read (its head's, then its body's); a read past them fails
  // and budget_exhausted() turns true.
  void set_budget(size_t bytes);
  bool budget_exhausted() const { return exhausted_; }
  // Bytes handed to the parser and written since begin_request().
  size_t bytes_read() const { return read_; }
  size_t bytes_written() const { return written_; }
  // A new request: `budget` bytes for its head, which must arrive by `head_deadline`.
  void begin_request(size_t budget, std::chrono::steady_clock::time_point head_deadline);
  // The head was read: no deadline but each read's timeout from now on.
  void end_head() { deadline_ = std::chrono::steady_clock::time_point::max(); }
  // Whether a read failed because the head's deadline passed.
  bool head_timed_out() const { return timed_out_; }
  // Whether the next request has begun to arrive (buffered bytes, or the socket readable: data or the
  // client's close) within `timeout`; false early once the server stops (`listener` closed).
  bool wait_next(std::chrono::milliseconds timeout, const std::atomic<socket_t>& listener) const;
  // Whether bytes the client sent are held here, not yet handed to the parser.
  bool buffered() const { return off_ < len_; }
  // Whether the client has shut its sending side (its FIN arrived; bytes it sent before may still be unread).
  bool peer_shut_write() const;

 private:
  bool wait(short events, std::chrono::microseconds timeout) const;
  int fd_;
  std::chrono::microseconds read_timeout_, write_timeout_;
  std::string buf_;
  size_t off_ = 0, len_ = 0;
  size_t budget_ = 0, read_ = 0, written_ = 0;
  bool exhausted_ = false, timed_out_ = false;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
};

struct WireLimits {
  size_t max_body_bytes = size_t{16} << 20;
};

// A body refused while it was read: the status (413, 400) and the message to answer with.
struct BodyRefusal {
  int status = 400;
  std::string message;
};

// httplib::Server with the connection loop above. The limits of every request: its head at most
// kMaxRequestHeadBytes; its body (read by the handler through read_body) at most limits.max_body_bytes,
// refused at once when Content-Length says more; its framing at most as much again.
class WireServer : public httplib::Server {
 public:
  explicit WireServer(WireLimits limits);
  const WireLimits& limits() const { return limits_; }

  // A POST route that reads its body (with read_body); a body sent to any other route is never read and
  // its connection closes after the response.
  void post_with_body(const std::string& path, HandlerWithContentReader handler);
  // Called for every routed request that passed the framing checks, before its body is read: true when it
  // answered the request itself (an API key refused, a CORS preflight); a body it leaves unread closes the
  // connection after the response. Set before listening.
  void set_gate(std::function<bool(const httplib::Request&, httplib::Response&)> gate) { gate_ = std::move(gate); }
  // Called on every response before its head is written (e.g. CORS headers). Set before listening.
  void set_response_hook(std::function<void(const httplib::Request&, httplib::Response&)> hook) {
    response_hook_ = std::move(hook);
  }
  // Reads the body of `req` into `*body` through `reader` (the route's), at most limits().max_body_bytes;
  // nullopt when it was read whole, else the refusal to answer with (the connection then closes after the
  // response). A request with neither Content-Length nor chunked Transfer-Encoding has an empty body.
  std::optional<BodyRefusal> read_body(const httplib::Request& req, const httplib::ContentReader& reader,
                                       std::string* body) const;

 private:
  bool process_and_close_socket(socket_t sock) override;
  // The refusal of a request before its body is read (Content-Length over the limit, framing this server
  // does not take, a body for a route that reads none), or nullopt; sets the response's status and marks
  // the connection.
  std::optional<int> refuse_before_body(const httplib::Request& req, httplib::Response& res) const;
  void request_ended(const ConnectionStream& strm);

  WireLimits limits_;
  std::vector<std::string> body_paths_;
  std::function<bool(const httplib::Request&, httplib::Response&)> gate_;
  std::function<void(const httplib::Request&, httplib::Response&)> response_hook_;
  std::atomic<int> in_flight_{0};
  std::atomic<int> since_trim_{0};
};

}  // namespace genbridge::serve
