#include "tools/serve/http_server.h"

#include <fmt/format.h>
#include <httplib.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <random>
#include <string_view>

#include "tools/serve/http_connection.h"
#include "tools/serve/structured_output.h"

namespace genbridge::serve {

using nlohmann::json;

namespace {

void reply_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}
void reply_error(httplib::Response& res, const ApiError& e) {
  // A full queue: OpenAI's clients retry after Retry-After seconds.
  if (e.http_status == 429) res.set_header("Retry-After", "1");
  reply_json(res, e.http_status, error_json(e));
}

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

// One choice of a request (one engine sequence) as the HTTP side follows it: its text (stop strings), its
// logprobs, the reasoning split, its tool calls, and how it ended.
struct ChoiceRun {
  std::shared_ptr<RequestStream> stream;
  size_t prompt = 0;       // the prompt it continues
  int index = 0;           // its index in the response (streamed: prompt x n + choice)
  size_t forced = 0;       // prompt tokens fed for their logprobs (echo with logprobs)
  size_t consumed = 0;     // tokens taken from the stream
  bool echo_only = false;  // max_tokens 0: the one generated token is discarded
  std::optional<TextStream> text;
  LogprobQueue logprobs;
  std::optional<ReasoningSplitter> reasoning;
  uint64_t tool_seed = 0;                         // its tool calls' ids
  std::optional<ToolCallParser> tools;            // streamed with tools: the calls parsed out of its content
  std::vector<engine::TokenLogprobs> prompt_lps;  // the forced tokens' logprobs
  std::vector<int32_t> ids;                       // generated ids (streamed: of the next chunk)
  int64_t completion_tokens = 0;
  double cumulative_logprob = 0;  // best_of: the sum of its tokens' logprobs
  bool ended = false, failed = false, began = false;
  size_t echo_chars = 0;  // completions' echo: the prompt's characters before the generated text
  engine::FinishReason reason = engine::FinishReason::kLength;
  std::string message;
  const char* finish = nullptr;
  json stop_reason;
  // A whole (non-streamed) reply's parts.
  std::string out_text, out_reasoning;
  std::vector<LogprobEntry> out_entries;
  std::vector<int32_t> out_ids;
};

// The request's choices, submitted together (one sequence per prompt and best_of choice).
struct Generation {
  ParsedRequest request;
  std::vector<ChoiceRun> runs;
  std::vector<int32_t> stop_tokens;  // what ends a sequence (eos unless ignore_eos, and the request's)
};

std::vector<int32_t> stop_set(const ParsedRequest& p, const ServedModel& model) {
  std::vector<int32_t> stops = p.ignore_eos ? std::vector<int32_t>{} : model.eos_tokens;
  for (int32_t t : p.stop_token_ids) {
    if (std::find(stops.begin(), stops.end(), t) == stops.end()) stops.push_back(t);
  }
  return stops;
}

// Submits every sequence of `p`: ok, or the error to answer with. `tool_seed`: the tool calls' ids.
std::optional<ApiError> start_generation(GenerationService& service, const ServedModel& model, ParsedRequest p,
                                         uint64_t drawn_seed, uint64_t tool_seed, Generation* g) {
  g->stop_tokens = stop_set(p, model);
  const uint64_t seed = p.seeded ? p.sampling.seed : drawn_seed;
  std::vector<GenerationRequest> requests;
  const bool best = p.best_of > p.n;
  for (size_t q = 0; q < p.prompts.size(); ++q) {
    const Prompt& prompt = p.prompts[q];
    for (int c = 0; c < p.best_of; ++c) {
      GenerationRequest gr{.prompt = prompt.ids,
                           .max_tokens = std::max(p.max_tokens, 1),
                           .sampling = p.sampling,
                           .stop_tokens = g->stop_tokens,
                           .logprobs = p.logprobs >= 0 ? p.logprobs : (best ? 0 : -1),
                           .priority = p.priority};
      gr.sampling.seed = seed + static_cast<uint64_t>(c);  // choice c of every prompt: seed + c
      ChoiceRun run;
      run.prompt = q;
      run.index = static_cast<int>(q) * p.n + c;
      run.echo_only = p.max_tokens == 0;
      // Echo with logprobs: the prompt after its first token is fed (forced) for its tokens' logprobs; the
      // first choice of each prompt computes them for all.
      if (p.prompt_logprobs() && c == 0 && prompt.ids.size() > 1) {
        gr.forced.assign(prompt.ids.begin() + 1, prompt.ids.end());
        gr.prompt.resize(1);
        gr.max_tokens += static_cast<int>(gr.forced.size());
        run.forced = gr.forced.size();
      }
      run.text.emplace(*model.tokenizer, p.stop, p.include_stop_str_in_output, p.sampling.min_tokens,
                       p.skip_special_tokens);
      // A constrained output follows its grammar from the first token: it holds no reasoning to split off.
      if (p.chat && model.reasoning_parser != ReasoningParser::kNone && !p.grammar) {
        run.reasoning.emplace(model.reasoning_parser);
      }
      // Structured outputs: each sequence follows the grammar with a matcher of its own.
      if (p.grammar) gr.constraint = make_token_constraint(p.grammar, g->stop_tokens);
      run.tool_seed = mix(tool_seed + g->runs.size());  // each sequence's calls get ids of their own
      if (p.stream && p.max_tool_calls > 0) run.tools.emplace(p.tool_format, run.tool_seed, p.max_tool_calls);
      g->runs.push_back(std::move(run));
      requests.push_back(std::move(gr));
    }
  }
  auto sub = service.submit_all(std::move(requests));
  if (!sub.ok()) return submit_error(sub.status());
  for (size_t i = 0; i < g->runs.size(); ++i) g->runs[i].stream = (*sub)[i];
  g->request = std::move(p);
  return std::nullopt;
}

// What one step of a run released: text (and its reasoning part), logprob entries, ids.
struct Delta {
  std::string text, reasoning;
  std::vector<LogprobEntry> entries;
  std::vector<int32_t> ids;
  bool prompt_done = false;  // the forced prompt tokens have all arrived (this step or before)
};

// Takes what the engine sent for `run` since the last call (without waiting), ends it on a stop string.
Delta absorb(ChoiceRun& run, const Generation& g, GenerationService& service) {
  const ParsedRequest& r = g.request;
  Delta d;
  if (run.ended) return d;
  std::vector<int32_t> toks;
  std::vector<engine::TokenLogprobs> lps;
  const bool ended = run.stream->wait(Clock::now(), &toks, &run.reason, &run.message, &lps);
  TextStream& ts = *run.text;
  std::string released;
  for (size_t i = 0; i < toks.size(); ++i) {
    const engine::TokenLogprobs* lp = i < lps.size() ? &lps[i] : nullptr;
    if (run.consumed < run.forced) {
      ++run.consumed;
      if (lp) run.prompt_lps.push_back(*lp);
      continue;
    }
    ++run.consumed;
    if (run.echo_only || ts.stopped()) continue;
    const int32_t t = toks[i];
    if (lp) {
      run.cumulative_logprob += lp->sampled.logprob;
      if (r.logprobs >= 0) run.logprobs.add(*lp, ts.decoded_bytes(), ts.decoded_chars());
    }
    // A stop token ends the sequence; its text is shown only with include_stop_str_in_output (vLLM).
    const bool stop_token = std::find(g.stop_tokens.begin(), g.stop_tokens.end(), t) != g.stop_tokens.end();
    if (!stop_token || r.include_stop_str_in_output) released += ts.push(t);
    if (stop_token && std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), t) != r.stop_token_ids.end()) {
      run.stop_reason = t;
    }
    d.ids.push_back(t);
    ++run.completion_tokens;
  }
  d.prompt_done = run.consumed >= run.forced;
  bool all = false;
  if (ts.stopped()) {
    service.stop(run.stream->id());
    run.ended = true;
    run.finish = "stop";
    run.stop_reason = ts.stop_string();
  } else if (ended && finish_name(run.reason)) {
    released += ts.finish();
    run.ended = true;
    run.finish = ts.stopped() ? "stop" : finish_name(run.reason);
    if (ts.stopped()) run.stop_reason = ts.stop_string();
    all = !ts.stopped();
  } else if (ended) {
    run.ended = run.failed = true;
  }
  if (r.logprobs >= 0) d.entries = run.logprobs.take(ts.released_bytes(), all);
  if (run.reasoning) {
    ReasoningSplitter::Parts parts = run.reasoning->push(released);
    if (run.ended) {
      ReasoningSplitter::Parts rest = run.reasoning->finish();
      parts.reasoning += rest.reasoning;
      parts.content += rest.content;
    }
    d.text = std::move(parts.content);
    d.reasoning = std::move(parts.reasoning);
  } else {
    d.text = std::move(released);
  }
  return d;
}

// The echoed prompt of a completions choice: its text, and with logprobs its tokens' entries (`*chars`: its
// length in characters, which shifts the generated tokens' text offsets).
std::vector<LogprobEntry> echo_entries(const Generation& g, const ChoiceRun& run, const std::vector<ChoiceRun>& runs,
                                       const ServedModel& model, size_t* chars) {
  const ParsedRequest& r = g.request;
  const Prompt& prompt = r.prompts[run.prompt];
  if (!r.prompt_logprobs()) {
    *chars = 0;
    for (unsigned char c : prompt.text) *chars += (c & 0xc0) != 0x80;
    return {};
  }
  // The first choice of the prompt fed it; every choice shows its logprobs.
  const ChoiceRun* feeder = &run;
  for (const ChoiceRun& o : runs) {
    if (o.prompt == run.prompt && o.forced > 0) feeder = &o;
  }
  return prompt_logprob_entries(*model.tokenizer, prompt.ids, feeder->prompt_lps, chars);
}

void cancel_unfinished(std::vector<ChoiceRun>& runs, GenerationService& service) {
  for (ChoiceRun& run : runs) {
    if (!run.ended) service.cancel(run.stream->id());
    run.ended = true;
  }
}

int64_t completion_tokens(const std::vector<ChoiceRun>& runs) {
  int64_t n = 0;
  for (const ChoiceRun& run : runs) n += run.completion_tokens;
  return n;
}

// One streamed response: everything its content provider needs between calls.
struct StreamState {
  Generation g;
  std::string id;
  int64_t created = 0;
  Clock::time_point deadline;
  uint64_t seen = 0;  // the StreamGroup's counter at the last look
  bool ended = false;
  PeerWatch peer{PeerWatch::Fin::kIgnored};
};

// One call of a streamed reply's content provider: waits a short slice for any choice's tokens and writes their
// chunks (at each choice's end its finish; at the end the usage when asked, and [DONE]); false once the client
// went away.
bool stream_step(StreamState* st, GenerationService* svc, const ServedModel* model, double timeout_s,
                 httplib::DataSink& sink) {
  if (st->ended) {
    sink.done();
    return true;
  }
  Generation& g = st->g;
  const ParsedRequest& r = g.request;
  // The runs share one StreamGroup: its counter read before looking, so that whatever arrives after the look
  // ends the wait below at once.
  StreamGroup& group = *g.runs.front().stream->group();
  st->seen = group.seq();
  std::string out;
  const auto usage_now = [&]() -> std::optional<Usage> {
    if (!r.continuous_usage) return std::nullopt;
    return Usage{.prompt_tokens = r.prompt_tokens(), .completion_tokens = completion_tokens(g.runs)};
  };
  const auto chunk = [&](const ChoiceOut& c) {
    out += sse(chunk_json(r, st->id, st->created, model->system_fingerprint, &c, usage_now()));
  };
  bool failed = false;
  for (ChoiceRun& run : g.runs) {
    if (run.ended && run.began) continue;
    // Echo with logprobs: a choice whose prompt another choice feeds starts once that one has (its echo carries
    // the prompt's logprobs); its tokens wait in its stream meanwhile.
    if (!run.began && r.prompt_logprobs() && run.forced == 0 &&
        std::any_of(g.runs.begin(), g.runs.end(),
                    [&](const ChoiceRun& o) { return o.prompt == run.prompt && o.consumed < o.forced && !o.ended; })) {
      continue;
    }
    ChoiceOut c{.index = run.index, .first_chat_chunk = !run.began && r.chat};
    Delta d = absorb(run, g, *svc);
    if (run.failed) {
      failed = true;
      continue;
    }
    if (!run.began && r.chat) {
      // The role first (with vLLM's echo, the last message's content), as OpenAI does.
      c.text = r.echo_text;
      chunk(c);
      c.first_chat_chunk = false;
      run.began = true;
    }
    if (!run.began && !r.chat) {
      // Completions: the echoed prompt (with its logprobs once the prompt's tokens were fed: until then the
      // feeding choice's deltas hold nothing else).
      if (r.echo && !d.prompt_done) continue;
      run.began = true;
      if (r.echo) {
        std::vector<LogprobEntry> entries = echo_entries(g, run, g.runs, *model, &run.echo_chars);
        ChoiceOut e{.index = run.index, .text = r.prompts[run.prompt].text};
        if (r.logprobs >= 0) e.logprobs = logprobs_json(r, *model->tokenizer, entries);
        chunk(e);
      }
    }
    run.ids.insert(run.ids.end(), d.ids.begin(), d.ids.end());  // sent with the next chunk of text
    // Tools: the content goes through the choice's parser (text that may begin a call is held back); its
    // calls follow the content as tool_calls deltas.
    std::vector<ToolCallDelta> calls;
    if (run.tools) {
      ParseDelta pd = run.tools->feed(d.text);
      if (run.ended) {
        ParseDelta rest = run.tools->finish();
        pd.content += rest.content;
        pd.calls.insert(pd.calls.end(), rest.calls.begin(), rest.calls.end());
      }
      d.text = std::move(pd.content);
      calls = std::move(pd.calls);
      if (run.ended && run.tools->num_calls() > 0 && run.finish && std::string_view(run.finish) == "stop")
        run.finish = "tool_calls";
    }
    if (!d.text.empty() || !d.reasoning.empty() || !d.entries.empty()) {
      c.text = std::move(d.text);
      c.reasoning = std::move(d.reasoning);
      c.token_ids = std::move(run.ids);
      run.ids.clear();
      if (r.logprobs >= 0) c.logprobs = logprobs_json(r, *model->tokenizer, d.entries, run.echo_chars);
      chunk(c);
    }
    if (!calls.empty()) {
      ChoiceOut t{.index = run.index, .tool_calls = tool_call_deltas_json(calls)};
      t.token_ids = std::move(run.ids);
      run.ids.clear();
      chunk(t);
    }
    if (run.ended) {
      ChoiceOut f{.index = run.index, .finish_reason = run.finish, .stop_reason = run.stop_reason};
      f.token_ids = std::move(run.ids);
      run.ids.clear();
      chunk(f);
    }
  }
  const bool all_ended = std::all_of(g.runs.begin(), g.runs.end(), [](const ChoiceRun& x) { return x.ended; });
  if (failed || (!all_ended && Clock::now() >= st->deadline)) {
    const ChoiceRun* bad = nullptr;
    for (const ChoiceRun& run : g.runs) {
      if (run.failed) bad = &run;
    }
    cancel_unfinished(g.runs, *svc);
    out += sse(error_json(
        finish_error(bad ? bad->reason : engine::FinishReason::kLength, bad ? bad->message : "", timeout_s)));
    st->ended = true;
  } else if (all_ended) {
    if (r.include_usage) {
      // OpenAI's usage chunk: no choices, the whole request's usage.
      out += sse(chunk_json(r, st->id, st->created, model->system_fingerprint, nullptr,
                            Usage{.prompt_tokens = r.prompt_tokens(), .completion_tokens = completion_tokens(g.runs)}));
    }
    st->ended = true;
  }
  if (st->ended) out += "data: [DONE]\n\n";
  // Nothing to send to a client that shut its side: is it still reading? A comment asks.
  if (out.empty() && st->peer.fin_seen()) out = ":\n\n";
  // Is anyone still there? Paced while there is nothing to write (queued), else before every write.
  if (out.empty() ? st->peer.gone() : st->peer.gone_now()) {
    cancel_unfinished(g.runs, *svc);
    st->ended = true;
    return false;
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    cancel_unfinished(g.runs, *svc);  // the client went away
    st->ended = true;
    return false;
  }
  if (st->ended) {
    sink.done();
  } else if (out.empty()) {
    // Nothing moved: wait a short slice for any choice of the request to move (a client that went away is
    // noticed at the next write or look).
    group.wait(st->seen, std::min(st->deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
  return true;
}

// A reply without streaming: waits for every choice (each until its end, a stop string, the deadline or the
// client going away) and answers with the whole completion; with best_of > n, each prompt's n choices with the
// highest summed logprob.
void reply_whole(httplib::Response& res, GenerationService& service, const ServedModel& model, double timeout_s,
                 Generation& g, const std::string& id, int64_t created, Clock::time_point deadline) {
  const ParsedRequest& r = g.request;
  // A client that goes away while it waits is noticed within kPeerCheckInterval (its socket polled).
  PeerWatch peer(PeerWatch::Fin::kLeaving);
  StreamGroup& group = *g.runs.front().stream->group();
  uint64_t seen = group.seq();
  for (;;) {
    for (ChoiceRun& run : g.runs) {
      Delta d = absorb(run, g, service);
      run.out_text += d.text;
      run.out_reasoning += d.reasoning;
      run.out_ids.insert(run.out_ids.end(), d.ids.begin(), d.ids.end());
      for (LogprobEntry& e : d.entries) run.out_entries.push_back(std::move(e));
    }
    const ChoiceRun* bad = nullptr;
    for (const ChoiceRun& run : g.runs) {
      if (run.failed) bad = &run;
    }
    if (bad) {
      const ApiError e = finish_error(bad->reason, bad->message, timeout_s);
      cancel_unfinished(g.runs, service);
      reply_error(res, e);
      return;
    }
    if (std::all_of(g.runs.begin(), g.runs.end(), [](const ChoiceRun& x) { return x.ended; })) break;
    if (Clock::now() >= deadline) {
      cancel_unfinished(g.runs, service);
      reply_error(res, finish_error(engine::FinishReason::kLength, "", timeout_s));
      return;
    }
    seen = group.wait(seen, std::min(deadline, peer.next_check()));
    if (peer.gone()) {
      cancel_unfinished(g.runs, service);
      if (Connection* c = current_connection()) c->close_after_response = true;
      reply_error(res, client_closed_error());
      return;
    }
  }
  // best_of: per prompt, the n runs with the highest summed logprob (stable: ties keep the lower index).
  std::vector<const ChoiceRun*> chosen;
  for (size_t q = 0; q < r.prompts.size(); ++q) {
    std::vector<const ChoiceRun*> of;
    for (const ChoiceRun& run : g.runs) {
      if (run.prompt == q) of.push_back(&run);
    }
    if (r.best_of > r.n) {
      std::stable_sort(of.begin(), of.end(), [](const ChoiceRun* a, const ChoiceRun* b) {
        return a->cumulative_logprob > b->cumulative_logprob;
      });
      of.resize(static_cast<size_t>(r.n));
    }
    chosen.insert(chosen.end(), of.begin(), of.end());
  }
  std::vector<ChoiceOut> choices;
  for (size_t i = 0; i < chosen.size(); ++i) {
    const ChoiceRun& run = *chosen[i];
    ChoiceOut c{.index = static_cast<int>(i), .finish_reason = run.finish, .stop_reason = run.stop_reason};
    c.token_ids = run.out_ids;
    std::vector<LogprobEntry> entries;
    size_t shift = 0;  // the echoed prompt's characters
    if (r.echo && !r.chat) {
      entries = echo_entries(g, run, g.runs, model, &shift);
      c.text = r.prompts[run.prompt].text;
    }
    if (r.chat) c.text = r.echo_text;
    bool called = false;
    if (r.max_tool_calls > 0) {
      // The whole content parsed at once: content that breaks the format stays content, as vLLM's parsers keep it.
      ToolCallParser::Whole w = ToolCallParser::parse(r.tool_format, run.out_text, run.tool_seed, r.max_tool_calls);
      called = !w.calls.empty();
      if (called) {
        c.tool_calls = tool_calls_json(w.calls);
        if (run.finish && std::string_view(run.finish) == "stop") c.finish_reason = "tool_calls";
      }
      c.text += w.content;
    } else {
      c.text += run.out_text;
    }
    if (run.reasoning) {
      c.has_reasoning = run.reasoning->saw_reasoning();
      c.reasoning = run.out_reasoning;
    }
    c.content_null = (c.has_reasoning || called) && c.text.empty();
    if (r.logprobs >= 0) {
      json lp = logprobs_json(r, *model.tokenizer, entries);
      json gen = logprobs_json(r, *model.tokenizer, run.out_entries, shift);
      if (r.chat) {
        c.logprobs = std::move(gen);
      } else {
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
          for (auto& v : gen[key]) lp[key].push_back(std::move(v));
        }
        c.logprobs = std::move(lp);
      }
    }
    choices.push_back(std::move(c));
  }
  const Usage u{.prompt_tokens = r.prompt_tokens(), .completion_tokens = completion_tokens(g.runs)};
  reply_json(res, 200, completion_json(r, id, created, model.system_fingerprint, choices, u));
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
  // Response ids: unique across processes (a restarted server does not begin again at the same ids).
  std::random_device entropy;
  id_salt_ = mix((static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^ next_seed_.load());
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
  counter("genbridge_preemptions_total",
          "Running requests preempted for KV pages (--preemption recompute); each is resumed by feeding its tokens "
          "again.",
          "", c.engine.preemptions);
  counter("genbridge_prefix_cache_queries_total",
          "Prefix caching: tokens of the requests started (a resumed request counts again).", "",
          c.engine.prefix_cache_queries);
  counter("genbridge_prefix_cache_hits_total", "Prefix caching: of those tokens, the ones found in the cache.", "",
          c.engine.prefix_cache_hits);
  counter("genbridge_prefix_cache_evictions_total", "Prefix caching: cached KV pages evicted for new ones.", "",
          c.engine.prefix_cache_evictions);
  gauge("genbridge_prefix_cache_pages", "Prefix caching: KV pages cached (held by requests or free to evict).",
        static_cast<double>(c.engine.prefix_cache_pages));
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
  // The same measurements under vLLM's names and label (dashboards and autoscalers made for vLLM read them).
  // One engine sequence is one vLLM request (a request's n choices count n).
  const std::string label = fmt::format("model_name=\"{}\"", model_.name());
  const auto vllm_gauge = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{}{{{}}} {}\n", name, help, name, name, label, v);
  };
  const auto vllm_counter = [&](const char* name, const char* help, int64_t v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} counter\n{}{{{}}} {}\n", name, help, name, name, label, v);
  };
  vllm_gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
             static_cast<double>(c.running));
  vllm_gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", static_cast<double>(c.queued));
  vllm_gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             c.kv_pages_total > 0 ? static_cast<double>(c.kv_pages_used) / static_cast<double>(c.kv_pages_total) : 0.0);
  vllm_counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", c.prompt_tokens);
  vllm_counter("vllm:generation_tokens_total", "Number of generation tokens processed.", c.generation_tokens);
  vllm_counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", c.engine.preemptions);
  vllm_counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
               c.engine.prefix_cache_queries);
  vllm_counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
               c.engine.prefix_cache_hits);
  o += service_.ttft().prometheus("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                                  label);
  o += service_.tpot().prometheus("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                                  label);
  o += service_.e2e().prometheus("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                                 label);
  o += service_.extra_metrics_text();
  return o;
}

std::string HttpServer::response_id(const char* prefix, const std::string& request_id) {
  if (!request_id.empty()) return fmt::format("{}-{}", prefix, request_id);
  const uint64_t n = next_id_++;
  return fmt::format("{}-{:016x}{:016x}", prefix, mix(id_salt_ ^ n), mix(mix(id_salt_) + n));
}

bool HttpServer::authorized(const httplib::Request& req) const {
  if (options_.api_keys.empty()) return true;
  const std::string header = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (header.size() <= kBearer.size() || strncasecmp(header.c_str(), kBearer.data(), kBearer.size()) != 0) return false;
  const std::string_view key = std::string_view(header).substr(kBearer.size());
  bool match = false;
  for (const std::string& k : options_.api_keys) {
    // Compared in time independent of where they differ.
    unsigned diff = k.size() != key.size();
    for (size_t i = 0; i < k.size(); ++i) diff |= static_cast<unsigned char>(k[i]) ^ (i < key.size() ? key[i] : 0);
    match = match || diff == 0;
  }
  return match;
}

bool HttpServer::origin_allowed(const std::string& origin) const {
  if (origin.empty()) return false;
  return std::any_of(options_.allowed_origins.begin(), options_.allowed_origins.end(),
                     [&](const std::string& o) { return o == "*" || o == origin; });
}

void HttpServer::routes() {
  httplib::Server& s = *server_;
  set_error_handlers(s);
  // --api-key and CORS preflights, before a route reads anything.
  server_->set_gate([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {
      const std::string origin = req.get_header_value("Origin");
      if (!origin.empty() && req.has_header("Access-Control-Request-Method") && !origin_allowed(origin)) {
        reply_error(res, ApiError{.http_status = 403,
                                  .message = fmt::format("The origin '{}' is not allowed (--allowed-origins).", origin),
                                  .code = "origin_not_allowed"});
        return true;
      }
      res.status = 204;
      res.set_header("Allow", "GET, POST, OPTIONS");
      if (origin_allowed(origin)) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        const std::string asked = req.get_header_value("Access-Control-Request-Headers");
        res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type" : asked);
        res.set_header("Access-Control-Max-Age", "600");
      }
      return true;
    }
    if (req.path == "/health" || req.path == "/metrics" || authorized(req)) return false;
    res.set_header("WWW-Authenticate", "Bearer");
    reply_error(res, ApiError{.http_status = 401,
                              .message = "Incorrect or missing API key: send 'Authorization: Bearer <key>' with a key "
                                         "the server was started with (--api-key).",
                              .code = "invalid_api_key"});
    return true;
  });
  server_->set_response_hook([this](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = req.get_header_value("Origin");
    if (!origin_allowed(origin)) return;
    const bool any = std::find(options_.allowed_origins.begin(), options_.allowed_origins.end(), "*") !=
                     options_.allowed_origins.end();
    res.set_header("Access-Control-Allow-Origin", any ? "*" : origin);
    if (!any) res.set_header("Vary", "Origin");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (service_.failed()) {
      reply_json(res, 503, json{{"status", "engine_failed"}});
    } else if (service_.draining()) {
      reply_json(res, 503, json{{"status", "shutting_down"}});
    } else {
      reply_json(res, 200, json{{"status", "ok"}});
    }
  });
  const auto card = [this](const std::string& name) {
    return json{{"id", name},
                {"object", "model"},
                {"created", created_},
                {"owned_by", "genbridge"},
                {"root", model_.name()},
                {"parent", nullptr},
                {"max_model_len", model_.max_position_embeddings}};
  };
  s.Get("/v1/models", [this, card](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const std::string& name : model_.names) data.push_back(card(name));
    reply_json(res, 200, json{{"object", "list"}, {"data", std::move(data)}});
  });
  s.Get(R"(/v1/models/(.+))", [this, card](const httplib::Request& req, httplib::Response& res) {
    const std::string name = req.matches[1];
    if (!model_.serves(name)) {
      reply_error(res, ApiError{.http_status = 404,
                                .message = fmt::format("The model '{}' does not exist.", name),
                                .param = "model",
                                .code = "model_not_found"});
      return;
    }
    reply_json(res, 200, card(name));
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  for (bool tokenize_route : {true, false}) {
    server_->post_with_body(tokenize_route ? "/tokenize" : "/detokenize",
                            [this, tokenize_route](const httplib::Request& req, httplib::Response& res,
                                                   const httplib::ContentReader& reader) {
                              std::string body;
                              if (auto refused = server_->read_body(req, reader, &body)) {
                                reply_error(res, ApiError{.http_status = refused->status, .message = refused->message});
                                return;
                              }
                              text::RenderLimits limits;
                              limits.deadline =
                                  Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(options_.request_timeout_s));
                              auto out = tokenize_route ? tokenize(body, model_, limits) : detokenize(body, model_);
                              if (auto* e = std::get_if<ApiError>(&out)) {
                                reply_error(res, *e);
                                return;
                              }
                              reply_json(res, 200, std::get<json>(out));
                            });
  }
  generation_route(false);
  generation_route(true);
}

void HttpServer::generation_route(bool chat) {
  const char* route = chat ? "/v1/chat/completions" : "/v1/completions";
  server_->post_with_body(
      route, [this, chat](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
        ++http_requests_;
        const Clock::time_point deadline =
            Clock::now() +
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.request_timeout_s));
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
        const std::string id = response_id(chat ? "chatcmpl" : "cmpl", p.request_id);
        const bool stream = p.stream;
        auto st = std::make_shared<StreamState>();
        const uint64_t drawn_seed = mix(next_seed_++), tool_seed = mix(next_seed_++);
        if (auto e = start_generation(service_, model_, std::move(p), drawn_seed, tool_seed, &st->g)) {
          reply_error(res, *e);
          return;
        }
        const int64_t created = static_cast<int64_t>(std::time(nullptr));
        if (!stream) {
          reply_whole(res, service_, model_, options_.request_timeout_s, st->g, id, created, deadline);
          return;
        }
        st->id = id;
        st->created = created;
        st->deadline = deadline;
        st->peer = PeerWatch(PeerWatch::Fin::kIgnored);
        res.set_header("Cache-Control", "no-cache");
        GenerationService* svc = &service_;
        const ServedModel* model = &model_;
        const double timeout_s = options_.request_timeout_s;
        res.set_chunked_content_provider(
            "text/event-stream",
            [st, svc, model, timeout_s](size_t, httplib::DataSink& sink) {
              return stream_step(st.get(), svc, model, timeout_s, sink);
            },
            [st, svc](bool) {
              if (!st->ended) cancel_unfinished(st->g.runs, *svc);
            });
      });
}

}  // namespace genbridge::serve
