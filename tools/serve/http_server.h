#pragma once
// The HTTP side of `genbridge serve` (cpp-httplib, Debian libcpp-httplib-dev): the OpenAI-compatible
// endpoints over a GenerationService.
//   POST /v1/completions, POST /v1/chat/completions   (JSON, or server-sent events with "stream": true)
//   GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics (Prometheus text format, genbridge's and
//   vLLM's names), POST /tokenize, POST /detokenize (vLLM's)
// --api-key: every route but /health, /metrics and CORS preflights needs "Authorization: Bearer <key>" (401
// otherwise); --allowed-origins: CORS (preflight OPTIONS answered 204, Access-Control-Allow-Origin on replies
// to an allowed Origin). docs/serving.md, "Operations".
// Connections: tools/serve/http_connection.h (pipelining, half-close, the limits of docs/serving.md).
// A request whose client goes away is cancelled (its KV pages are freed): a streamed one before the next
// event it would send, one with nothing to send (a non-streamed reply, a queued stream) within 100 ms (its
// connection's socket is polled). Going away is a reset (the client closed the connection and the server
// wrote), or, for a non-streamed request, shutting its sending side after the request's handler began (a
// client that half-closes right after sending its request gets the response; a half-closed client keeps
// reading a stream to its end). Shutdown (stop()):
// /health turns 503 and new requests get 503 while in-flight ones finish (until the deadline, then they are cancelled),
// then the listener closes.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "genbridge/core/status.h"
#include "tools/serve/openai.h"
#include "tools/serve/service.h"

namespace httplib {
struct Request;
}

namespace genbridge::serve {

class WireServer;

// Fixes the allocator's thresholds for a long-running server (call once, before threads start): blocks of
// 1 MiB and more are mapped and unmapped on their own, and the free top of a heap is returned beyond 1 MiB.
// glibc's defaults adapt instead: freeing one large block raises both thresholds (up to 32 / 64 MiB),
// after which every request's large buffers stay in the per-thread arenas (malloc_trim, which the
// connection loop calls, returns free pages inside a heap but not the free top of a thread's arena). No-op
// without glibc.
void tune_allocator_for_serving();

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port
  int threads = 0;                 // HTTP worker threads; 0: max_batch + max_queued_requests + 8
  double request_timeout_s = 600;  // most seconds one request may take; then it is cancelled
  size_t max_body_bytes = size_t{16} << 20;  // a request body beyond it is refused (413) while it is read
  std::vector<std::string> api_keys;         // --api-key (any of them); empty: no authentication
  std::vector<std::string> allowed_origins;  // --allowed-origins; "*": any; empty: no CORS headers
};

class HttpServer {
 public:
  HttpServer(GenerationService& service, const ServedModel& model, const HttpOptions& options, int default_threads);
  ~HttpServer();
  // Binds (Unavailable naming the address when it cannot); returns the port.
  Result<int> bind();
  // Serves until stop(); returns when the listener is closed and every worker has ended.
  Status listen();
  // Stops accepting connections (after the service has drained).
  void stop();
  // The /metrics text.
  std::string metrics_text() const;

 private:
  void routes();
  void generation_route(bool chat);
  // A response id: "<prefix>-<request_id>" when the request named one, else 32 hex digits unique to the process.
  std::string response_id(const char* prefix, const std::string& request_id);
  // Whether `req` may pass (--api-key); the CORS headers of a response.
  bool authorized(const httplib::Request& req) const;
  bool origin_allowed(const std::string& origin) const;
  GenerationService& service_;
  const ServedModel& model_;
  HttpOptions options_;
  std::unique_ptr<WireServer> server_;
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_ = 0;  // drawn at start-up: response ids differ across processes
  std::atomic<uint64_t> next_seed_;
  std::atomic<int64_t> bad_requests_{0}, http_requests_{0};
  int64_t created_ = 0;
  int listen_socket_ = -1;
  static constexpr int kListenBacklog = 1024;
};

}  // namespace genbridge::serve
