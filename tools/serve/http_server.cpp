#include "tools/serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>

#include "tools/serve/http_connection.h"
#include "tools/serve/structured_output.h"

namespace genbridge::serve {

using nlohmann::json;

namespace {

void reply_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}
void reply_error(httplib::Response& res, const ApiError& e) { reply_json(res, e.http_status, error_json(e)); }

ApiError server_error(int status, std::string message, std::string code) {
  return ApiError{
      .http_status = status, .message = std::move(message), .type = "server_error", .code = std::move(code)};
}

// The error a submit refusal becomes.
ApiError submit_error(const Status& s) {
  switch (s.code()) {
    case StatusCode::kResourceExhausted:
      return ApiError{.http_status = 429, .message = s.message(), .type = "rate_limit_error", .code = "queue_full"};
    case StatusCode::kUnavailable:
      return server_error(503, s.message(), "unavailable");
    case StatusCode::kInvalidArgument:
      return ApiError{.http_status = 400, .message = s.message()};
    default:
      return server_error(500, s.message(), "internal_error");
  }
}

// How an engine finish reads to the client: "stop" / "length", or the error it becomes.
const char* finish_name(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    default:
      return nullptr;
  }
}
ApiError finish_error(engine::FinishReason r, const std::string& message, double timeout_s) {
  switch (r) {
    case engine::FinishReason::kCancelled:
      return server_error(503, "The request was cancelled: the server is shutting down.", "shutting_down");
    case engine::FinishReason::kRefused:
      return ApiError{.http_status = 400, .message = message};
    case engine::FinishReason::kError:
      return server_error(500, message, "generation_error");
    default:
      return server_error(504, fmt::format("The request did not finish within --request-timeout {} s.", timeout_s),
                          "timeout");
  }
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// How often a request that has nothing to send checks that its client is still connected.
constexpr auto kPeerCheckInterval = std::chrono::milliseconds(100);

// Notices a client that went away while its request runs. A reset (or a hang-up) always counts. A FIN alone
// (the client shut its sending side, or closed the socket: the server cannot tell which until it writes)
// counts only for a request with nothing written yet and only when it came after the request was read and
// parsed (when the watch is made): a client that half-closed with its request still gets the response.
// For a streamed request a FIN never counts (a half-closed client still reading gets every event, however
// late its FIN came): the stream writes, and a closed socket answers the write with a reset; with nothing
// to send it writes an SSE comment, which readers skip (fin_seen()). next_check() paces a request that has nothing to
// send (a non-streamed reply, a streamed request still queued) at kPeerCheckInterval. Make and use it on the thread
// that serves the request (it owns the connection).
class PeerWatch {
 public:
  enum class Fin { kLeaving, kIgnored };
  explicit PeerWatch(Fin fin) : next_(Clock::now() + kPeerCheckInterval) {
    if (const Connection* c = current_connection()) {
      fd_ = c->fd;
      fin_is_leaving_ = fin == Fin::kLeaving && !(c->stream && c->stream->peer_shut_write());
    }
  }
  Clock::time_point next_check() const { return next_; }
  // True once the client has gone (checked only when next_check() has passed).
  bool gone() {
    const Clock::time_point now = Clock::now();
    if (now < next_) return false;
    next_ = now + kPeerCheckInterval;
    return gone_now();
  }
  // True when the client has shut its sending side or closed the connection (one poll).
  bool fin_seen() const { return (revents() & POLLRDHUP) != 0; }
  // True once the client has gone (one poll).
  bool gone_now() const {
    const short r = revents();
    if (r & (POLLHUP | POLLERR | POLLNVAL)) return true;
    return fin_is_leaving_ && (r & POLLRDHUP) != 0;
  }

 private:
  // The socket's poll events now (0 without a connection or when none is pending).
  short revents() const {
    if (fd_ < 0) return 0;
    pollfd p{.fd = fd_, .events = POLLIN | POLLRDHUP, .revents = 0};
    return ::poll(&p, 1, 0) > 0 ? p.revents : 0;
  }

  int fd_ = -1;
  bool fin_is_leaving_ = false;
  Clock::time_point next_;
};

// The answer to a client that shut its sending side while its request ran (one that closed the whole
// connection never reads it).
ApiError client_closed_error() {
  return ApiError{.http_status = 400,
                  .message =
                      "The client shut its side of the connection while the request ran; the request was "
                      "cancelled. A client may half-close only together with its request.",
                  .code = "client_closed_request"};
}

// OpenAI's tool_calls entries: whole calls (a message), or a stream's deltas (a chunk's delta).
json tool_calls_json(const std::vector<ToolCall>& calls) {
  json a = json::array();
  for (const ToolCall& c : calls) {
    a.push_back(json{{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return a;
}
json tool_call_deltas_json(const std::vector<ToolCallDelta>& deltas) {
  json a = json::array();
  for (const ToolCallDelta& d : deltas) {
    json e = {{"index", d.index}};
    if (d.first) {
      e["id"] = d.id;
      e["type"] = "function";
      e["function"] = {{"name", d.name}, {"arguments", d.arguments}};
    } else {
      e["function"] = {{"arguments", d.arguments}};
    }
    a.push_back(std::move(e));
  }
  return a;
}

// One streamed response: everything its content provider needs between calls.
struct StreamState {
  ParsedRequest request;
  std::shared_ptr<RequestStream> stream;
  TextStream text;
  std::string id;
  int64_t created = 0;
  Clock::time_point deadline;
  bool first = true, ended = false;
  int64_t completion_tokens = 0;
  std::vector<int32_t> ids_pending;  // token ids of the next chunk (return_token_ids)
  LogprobQueue logprobs;             // requests with logprobs: entries waiting for their text
  PeerWatch peer{PeerWatch::Fin::kIgnored};
  std::shared_ptr<ToolCallParser> tools;  // tool calls parsed out of the text (null: none)
};

// One call of a streamed reply's content provider: waits a short slice for tokens and writes their chunks (at
// the end the finish, the usage and [DONE]); false once the client went away.
bool stream_step(StreamState* st, GenerationService* svc, const text::Tokenizer* tokenizer,
                 const std::string& model_name, double timeout_s, httplib::DataSink& sink) {
  if (st->ended) {
    sink.done();
    return true;
  }
  const ParsedRequest& r = st->request;
  std::vector<int32_t> toks;
  std::vector<engine::TokenLogprobs> lps;
  engine::FinishReason reason = engine::FinishReason::kLength;
  std::string message;
  // Short slices: a client that went away is noticed at the next write.
  const bool ended = st->stream->wait(std::min(st->deadline, Clock::now() + std::chrono::milliseconds(200)), &toks,
                                      &reason, &message, &lps);
  std::string out;
  auto chunk = [&](const std::string& text, const char* finish, bool last,
                   const std::vector<LogprobEntry>* entries = nullptr) {
    std::optional<Usage> usage;
    if (last) {
      usage = Usage{.prompt_tokens = static_cast<int64_t>(r.prompt.size()), .completion_tokens = st->completion_tokens};
    }
    out += sse(chunk_json(r, st->id, st->created, model_name, text, finish, usage, st->first && r.chat, st->ids_pending,
                          entries ? logprobs_json(r, *tokenizer, *entries) : json()));
    st->ids_pending.clear();
    st->first = false;
  };
  if (st->first && r.chat) chunk("", nullptr, false);  // the role first, as OpenAI does
  std::string text;
  for (size_t i = 0; i < toks.size(); ++i) {
    if (st->text.stopped()) break;
    if (i < lps.size()) st->logprobs.add(std::move(lps[i]), st->text.decoded_bytes(), st->text.decoded_chars());
    text += st->text.push(toks[i]);
    st->ids_pending.push_back(toks[i]);
    ++st->completion_tokens;
  }
  // The text of this call and the logprobs of the tokens it begins; every one left at an end without
  // a stop string. With tool calls: the parser's content, then its tool-call deltas (`last`: the parser's rest).
  auto text_chunk = [&](bool all, bool last = false) {
    std::vector<LogprobEntry> entries;
    if (r.logprobs >= 0) entries = st->logprobs.take(st->text.released_bytes(), all);
    if (!st->tools) {
      if (!text.empty() || !entries.empty()) chunk(text, nullptr, false, &entries);
      return;
    }
    ParseDelta d = st->tools->feed(text);
    if (last) {
      ParseDelta rest = st->tools->finish();
      d.content += rest.content;
      d.calls.insert(d.calls.end(), rest.calls.begin(), rest.calls.end());
    }
    if (!d.content.empty() || !entries.empty()) chunk(d.content, nullptr, false, &entries);
    if (!d.calls.empty()) {
      json j = chunk_json(r, st->id, st->created, model_name, "", nullptr, std::nullopt, false, st->ids_pending);
      j["choices"][0]["delta"]["tool_calls"] = tool_call_deltas_json(d.calls);
      out += sse(j);
      st->ids_pending.clear();
    }
  };
  // "tool_calls" when the model called a tool and stopped (OpenAI's finish reason), else `reason`.
  auto finish_of = [&](const char* reason) {
    return st->tools && st->tools->num_calls() > 0 && std::string(reason) == "stop" ? "tool_calls" : reason;
  };
  const Clock::time_point now = Clock::now();
  if (st->text.stopped()) {
    svc->stop(st->stream->id());
    text_chunk(false, true);
    chunk("", finish_of("stop"), true);
    st->ended = true;
  } else if (ended && finish_name(reason)) {
    text += st->text.finish();
    text_chunk(!st->text.stopped(), true);
    chunk("", finish_of(st->text.stopped() ? "stop" : finish_name(reason)), true);
    st->ended = true;
  } else {
    text_chunk(false, ended || now >= st->deadline);
    if (ended || now >= st->deadline) {
      if (!ended) svc->cancel(st->stream->id());
      out += sse(error_json(finish_error(ended ? reason : engine::FinishReason::kLength, message, timeout_s)));
      st->ended = true;
    }
  }
  if (st->ended && r.include_usage) {
    // OpenAI's usage chunk: no choices, the whole request's usage.
    out += sse(json{{"id", st->id},
                    {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", st->created},
                    {"model", model_name},
                    {"choices", json::array()},
                    {"usage", usage_json(Usage{.prompt_tokens = static_cast<int64_t>(r.prompt.size()),
                                               .completion_tokens = st->completion_tokens})}});
  }
  if (st->ended) out += "data: [DONE]\n\n";
  // Nothing to send to a client that shut its side: is it still reading? A comment asks.
  if (out.empty() && st->peer.fin_seen()) out = ":\n\n";
  // Is anyone still there? Paced while there is nothing to write (queued), else before every write.
  if (out.empty() ? st->peer.gone() : st->peer.gone_now()) {
    svc->cancel(st->stream->id());
    st->ended = true;
    return false;
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    svc->cancel(st->stream->id());  // the client went away
    st->ended = true;
    return false;
  }
  if (st->ended) sink.done();
  return true;
}

// A reply without streaming: waits for every token of `stream` (or a stop string, the deadline, the client
// going away) and answers with the whole completion.
void reply_whole(httplib::Response& res, GenerationService& service, const ServedModel& model, double timeout_s,
                 const ParsedRequest& p, const std::shared_ptr<RequestStream>& stream, const std::string& id,
                 int64_t created, Clock::time_point deadline, const Usage& prompt_usage, uint64_t tool_seed) {
  TextStream ts(*model.tokenizer, p.stop);
  LogprobQueue lq;
  std::string out;
  std::vector<int32_t> ids;
  const char* finish = nullptr;
  engine::FinishReason reason = engine::FinishReason::kLength;
  std::string message;
  bool ended = false;
  // A client that goes away while it waits is noticed within kPeerCheckInterval (its socket polled).
  PeerWatch peer(PeerWatch::Fin::kLeaving);
  while (!ended && !ts.stopped()) {
    std::vector<int32_t> toks;
    std::vector<engine::TokenLogprobs> lps;
    ended = stream->wait(std::min(deadline, peer.next_check()), &toks, &reason, &message, &lps);
    if (!ended && peer.gone()) {
      service.cancel(stream->id());
      if (Connection* c = current_connection()) c->close_after_response = true;
      reply_error(res, client_closed_error());
      return;
    }
    for (size_t i = 0; i < toks.size(); ++i) {
      if (ts.stopped()) break;
      if (i < lps.size()) lq.add(std::move(lps[i]), ts.decoded_bytes(), ts.decoded_chars());
      out += ts.push(toks[i]);
      ids.push_back(toks[i]);
    }
    if (!ended && !ts.stopped() && Clock::now() >= deadline) break;
  }
  if (ts.stopped()) {
    service.stop(stream->id());
    finish = "stop";
  } else if (ended && finish_name(reason)) {
    out += ts.finish();
    finish = ts.stopped() ? "stop" : finish_name(reason);
  } else {
    if (!ended) service.cancel(stream->id());
    reply_error(res, finish_error(ended ? reason : engine::FinishReason::kLength, message, timeout_s));
    return;
  }
  Usage u = prompt_usage;
  u.completion_tokens = static_cast<int64_t>(ids.size());
  std::optional<ToolCallParser::Whole> tools;
  if (p.max_tool_calls > 0) {
    tools = ToolCallParser::parse(p.tool_format, out, tool_seed, p.max_tool_calls);
    out = tools->content;
    if (!tools->calls.empty() && std::string(finish) == "stop") finish = "tool_calls";
  }
  json j = completion_json(p, id, created, model.name, out, finish, u, ids,
                           logprobs_json(p, *model.tokenizer, lq.take(ts.released_bytes(), !ts.stopped())));
  if (tools && !tools->calls.empty()) {
    json& m = j["choices"][0]["message"];
    if (tools->content.empty()) m["content"] = nullptr;
    m["tool_calls"] = tool_calls_json(tools->calls);
  }
  reply_json(res, 200, j);
}

// The replies httplib makes itself: errors (a route that does not exist, a head refused while it was read)
// and exceptions, as OpenAI-style error bodies.
void set_error_handlers(httplib::Server& s) {
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    Connection* c = current_connection();
    std::string message = res.status == 404 ? fmt::format("No route {} {}.", req.method, req.path)
                                            : fmt::format("HTTP error {}.", res.status);
    if (c && !c->refusal.empty()) {
      message = c->refusal;
    } else if (c && c->stream && c->stream->budget_exhausted() && !c->routed) {
      res.status = 431;
      message = fmt::format("The request's head (request line and headers) exceeds {} bytes, this server's limit.",
                            kMaxRequestHeadBytes);
    } else if (c && c->stream && c->stream->head_timed_out() && !c->routed) {
      res.status = 408;
      message = fmt::format("The request's head did not arrive within {} s, this server's limit.",
                            kMaxRequestHeadTime.count());
    } else if (c && !c->routed && res.status == 414) {
      message = "The request line exceeds 8192 bytes, this server's limit.";
    } else if (c && !c->routed) {
      message = "The request's line or headers are malformed (or a header line exceeds 8192 bytes).";
    }
    // A head that was not read whole leaves the rest of the input unreadable as requests.
    if (c && !c->routed) c->close_after_response = true;
    const ApiError e{.http_status = res.status, .message = message, .code = res.status == 404 ? "not_found" : ""};
    reply_json(res, res.status, error_json(e));
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, server_error(500, "Internal error: " + what, "internal_error"));
  });
}

}  // namespace

HttpServer::HttpServer(GenerationService& service, const ServedModel& model, const HttpOptions& options,
                       int default_threads)
    : service_(service),
      model_(model),
      options_(options),
      server_(std::make_unique<WireServer>(WireLimits{.max_body_bytes = options.max_body_bytes})) {
  next_seed_ = mix(static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()));
  created_ = static_cast<int64_t>(std::time(nullptr));
  const int threads = options_.threads > 0 ? options_.threads : default_threads;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  server_->set_keep_alive_timeout(5);
  // cpp-httplib 0.11 listens with a backlog of 5 (compiled into Debian's library): a burst of new connections
  // beyond it loses SYNs that the client resends a second later. The listening socket is remembered here
  // and its backlog raised after bind (Linux applies a second listen() to a listening socket).
  // Its default options set SO_REUSEPORT, with which a second server binds the same port and the kernel
  // splits the clients between the two: SO_REUSEADDR only (a restart may bind while old connections of
  // the port linger in TIME_WAIT), so a port in use is a bind error.
  server_->set_socket_options([this](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_socket_ = sock;
  });
  routes();
}

HttpServer::~HttpServer() = default;

Result<int> HttpServer::bind() {
  int port = options_.port;
  if (port == 0) {
    port = server_->bind_to_any_port(options_.host);
    if (port < 0) return unavailable(fmt::format("cannot listen on {} (any port)", options_.host));
  } else if (errno = 0; !server_->bind_to_port(options_.host, port)) {
    if (errno == EADDRINUSE) {
      return unavailable(
          fmt::format("cannot listen on {}:{} (--host, --port): port {} is in use (another server listens on it)",
                      options_.host, port, port));
    }
    return unavailable(fmt::format("cannot listen on {}:{} (--host, --port): the address is in use or not local",
                                   options_.host, port));
  }
  if (listen_socket_ >= 0) ::listen(listen_socket_, kListenBacklog);
  return port;
}

Status HttpServer::listen() {
  if (!server_->listen_after_bind() && server_->is_running()) return internal_error("the HTTP listener failed");
  return ok_status();
}

void HttpServer::stop() { server_->stop(); }

std::string HttpServer::metrics_text() const {
  const ServiceCounters c = service_.counters();
  std::string o;
  auto counter = [&](const char* name, const char* help, const std::string& labels, int64_t v, bool head = true) {
    if (head) o += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
    o += fmt::format("{}{} {}\n", name, labels, v);
  };
  auto gauge = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  counter("genbridge_http_requests_total", "Generation requests received (/v1/completions, /v1/chat/completions).", "",
          http_requests_.load());
  counter("genbridge_requests_total", "Generation requests by outcome.", "{outcome=\"accepted\"}", c.requests_accepted);
  counter("genbridge_requests_total", "", "{outcome=\"invalid\"}", bad_requests_.load(), false);
  counter("genbridge_requests_total", "", "{outcome=\"queue_full\"}", c.requests_rejected_queue_full, false);
  counter("genbridge_requests_finished_total",
          "Accepted requests that ended: stop (eos token or stop string), length, cancelled (client gone, timeout, "
          "shutdown), error, refused.",
          "{reason=\"stop\"}", c.finished_stop);
  counter("genbridge_requests_finished_total", "", "{reason=\"length\"}", c.finished_length, false);
  counter("genbridge_requests_finished_total", "", "{reason=\"cancelled\"}", c.finished_cancelled, false);
  counter("genbridge_requests_finished_total", "", "{reason=\"error\"}", c.finished_error, false);
  counter("genbridge_requests_finished_total", "", "{reason=\"refused\"}", c.finished_refused, false);
  counter("genbridge_prompt_tokens_total", "Prompt tokens of accepted requests.", "", c.prompt_tokens);
  counter("genbridge_generation_tokens_total", "Tokens generated.", "", c.generation_tokens);
  gauge("genbridge_queue_depth", "Accepted requests waiting to start.", static_cast<double>(c.queued));
  gauge("genbridge_running_requests", "Requests being decoded.", static_cast<double>(c.running));
  gauge("genbridge_kv_pages_used", "KV cache pages in use.", static_cast<double>(c.kv_pages_used));
  gauge("genbridge_kv_pages_total", "KV cache pages in the pool.", static_cast<double>(c.kv_pages_total));
  gauge("genbridge_kv_usage_ratio", "Fraction of the KV cache pool in use.",
        c.kv_pages_total > 0 ? static_cast<double>(c.kv_pages_used) / static_cast<double>(c.kv_pages_total) : 0.0);
  gauge("genbridge_kv_bytes_used", "KV cache bytes in use.",
        static_cast<double>(c.kv_pages_used * c.kv_bytes_per_page));
  if (c.state_slots_total > 0) {  // a model with per-sequence state: one slot per running sequence, beside the pages
    const std::string help =
        fmt::format("Per-sequence state slots in use ({}; one per running sequence).", c.state_contents);
    gauge("genbridge_kv_state_slots_used", help.c_str(), static_cast<double>(c.state_slots_used));
    gauge("genbridge_kv_state_slots_total", "Per-sequence state slots in the pool.",
          static_cast<double>(c.state_slots_total));
    gauge("genbridge_kv_state_bytes_used", "Bytes of the per-sequence state slots in use.",
          static_cast<double>(c.state_slots_used * c.bytes_per_state_slot));
  }
  o += service_.ttft().prometheus("genbridge_time_to_first_token_seconds",
                                  "Time from a request's acceptance to its first token.");
  o += service_.tpot().prometheus("genbridge_time_per_output_token_seconds",
                                  "Time between consecutive tokens of a request.");
  o += service_.e2e().prometheus("genbridge_request_duration_seconds", "Time from acceptance to the end of a request.");
  o += service_.extra_metrics_text();
  return o;
}

void HttpServer::routes() {
  httplib::Server& s = *server_;
  set_error_handlers(s);
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (service_.failed()) {
      reply_json(res, 503, json{{"status", "engine_failed"}});
    } else if (service_.draining()) {
      reply_json(res, 503, json{{"status", "shutting_down"}});
    } else {
      reply_json(res, 200, json{{"status", "ok"}});
    }
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    reply_json(res, 200,
               json{{"object", "list"},
                    {"data", json::array({json{{"id", model_.name},
                                               {"object", "model"},
                                               {"created", created_},
                                               {"owned_by", "genbridge"},
                                               {"max_model_len", model_.max_position_embeddings}}})}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  for (bool chat : {false, true}) {
    const char* route = chat ? "/v1/chat/completions" : "/v1/completions";
    server_->post_with_body(route, [this, chat](const httplib::Request& req, httplib::Response& res,
                                                const httplib::ContentReader& reader) {
      ++http_requests_;
      const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                            std::chrono::duration<double>(options_.request_timeout_s));
      std::string body;
      if (auto refused = server_->read_body(req, reader, &body)) {
        ++bad_requests_;
        reply_error(res, ApiError{.http_status = refused->status, .message = refused->message});
        return;
      }
      // The chat template renders within the request's deadline and stops when its client goes or the server drains.
      PeerWatch render_peer(PeerWatch::Fin::kLeaving);
      text::RenderLimits render_limits;
      render_limits.deadline = deadline;
      render_limits.cancelled = [&] { return service_.draining() || render_peer.gone(); };
      auto parsed = parse_request(body, chat, model_, render_limits);
      body.clear();
      body.shrink_to_fit();
      if (auto* e = std::get_if<ApiError>(&parsed)) {
        ++bad_requests_;
        reply_error(res, *e);
        return;
      }
      ParsedRequest p = std::get<ParsedRequest>(std::move(parsed));
      if (!p.seeded) p.sampling.seed = mix(next_seed_++);
      const uint64_t tool_seed = mix(next_seed_++);  // the tool calls' ids
      const std::vector<int32_t> stops = p.ignore_eos ? std::vector<int32_t>{} : model_.stop_tokens;
      auto sub = service_.submit(GenerationRequest{.prompt = p.prompt,
                                                   .max_tokens = p.max_tokens,
                                                   .sampling = p.sampling,
                                                   .stop_tokens = stops,
                                                   .logprobs = p.logprobs,
                                                   .constraint = p.grammar ? make_token_constraint(p.grammar, stops)
                                                                           : nullptr});
      if (!sub.ok()) {
        reply_error(res, submit_error(sub.status()));
        return;
      }
      std::shared_ptr<RequestStream> stream = std::move(sub).value();
      const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id_++);
      const int64_t created = static_cast<int64_t>(std::time(nullptr));
      const Usage prompt_usage{.prompt_tokens = static_cast<int64_t>(p.prompt.size())};
      if (!p.stream) {
        reply_whole(res, service_, model_, options_.request_timeout_s, p, stream, id, created, deadline, prompt_usage,
                    tool_seed);
        return;
      }
      auto st = std::make_shared<StreamState>(StreamState{.request = p,
                                                          .stream = stream,
                                                          .text = TextStream(*model_.tokenizer, p.stop),
                                                          .id = id,
                                                          .created = created,
                                                          .deadline = deadline,
                                                          .peer = PeerWatch(PeerWatch::Fin::kIgnored)});
      if (p.max_tool_calls > 0) {
        st->tools = std::make_shared<ToolCallParser>(p.tool_format, tool_seed, p.max_tool_calls);
      }
      res.set_header("Cache-Control", "no-cache");
      GenerationService* svc = &service_;
      const text::Tokenizer* tokenizer = model_.tokenizer;
      const std::string model_name = model_.name;
      const double timeout_s = options_.request_timeout_s;
      res.set_chunked_content_provider(
          "text/event-stream",
          [st, svc, tokenizer, model_name, timeout_s](size_t, httplib::DataSink& sink) {
            return stream_step(st.get(), svc, tokenizer, model_name, timeout_s, sink);
          },
          [st, svc](bool) {
            if (!st->ended) svc->cancel(st->stream->id());
          });
    });
  }
}

}  // namespace genbridge::serve
