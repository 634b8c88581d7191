#pragma once
// The relay of a serving job whose attention ranks do not share a process (`genbridge serve --afd 2A1F
// --afd-transport mpi`): attention rank 0 serves HTTP and forwards each request that its service assigns
// to attention rank a >= 1 over the job's transport; rank a runs it on its own engine and sends the tokens
// back. Every call is made on the thread that runs the rank (the MPI transport is used by that thread
// only), so attention rank 0 relays between its own steps and while it waits for work
// (docs/afd_mpi.md#serving-under-mpirun).
//
// Down (attention rank 0 -> attention rank a): requests to admit, requests to cancel, and two flags: the
// server is stopping (the rank ends once it holds nothing), and another attention rank holds a request (a
// lockstep rank then steps beside it; AttentionIdle's `others`).
// Up (attention rank a -> attention rank 0): every token (with its log-probabilities when its request asked
// for them) and every ended request (reason, message) in the order the engine reported them, and the rank's
// running requests and KV pages in use; sent after each of its steps and whenever a request ended without
// one (refused at submit, cancelled while waiting). Each rank's first Up message says its engine is up.
// A message travels as two on Channel::kControl: its size (8 bytes), then its bytes (afd/byte_codec.h), on
// the same tag, so the transport's per-(source, tag) order pairs them.
//
// Deadlines: attention rank 0 waits at most init_timeout_ms for every other attention rank's first message;
// while rank a holds requests, attention rank 0 waits at most 2 x timeout_ms for its next message (each of
// its steps waits at most that long for the FFN ranks); the second half of a message is due within
// timeout_ms of the first. A timeout names both ranks and ends the job.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "afd/transport.h"
#include "afd/work_wait.h"
#include "genbridge/core/status.h"
#include "runtime/engine/engine.h"

namespace genbridge::afd {

// Attention rank 0 -> attention rank a.
struct RelayDown {
  // In the order the service accepted them: every field of engine::Request but `constraint` (a grammar
  // matcher over the tokenizer, which a relayed rank does not load), so the service gives a request with a
  // constraint to a local worker only (serve::WorkerPools::local_workers).
  std::vector<engine::Request> submit;
  std::vector<int64_t> cancel;  // request ids
  bool stopping = false;        // sticky: the server accepts nothing more
  bool others_busy = false;     // another attention rank holds a request
};

struct RelayToken {
  int64_t id = 0;
  int32_t token = 0;
  bool has_logprobs = false;
  engine::TokenLogprobs logprobs;
};
struct RelayFinish {
  int64_t id = 0;
  engine::FinishReason reason = engine::FinishReason::kLength;
  std::string message;
};
// An engine's counters a relayed rank reports (engine::EngineMetrics's).
struct RelayEngineCounters {
  int64_t preemptions = 0, prefix_cache_queries = 0, prefix_cache_hits = 0, prefix_cache_evictions = 0;
  int64_t prefix_cache_pages = 0;
  RelayEngineCounters& operator+=(const RelayEngineCounters& o) {
    preemptions += o.preemptions;
    prefix_cache_queries += o.prefix_cache_queries;
    prefix_cache_hits += o.prefix_cache_hits;
    prefix_cache_evictions += o.prefix_cache_evictions;
    prefix_cache_pages += o.prefix_cache_pages;
    return *this;
  }
};
inline RelayEngineCounters engine_counters(const engine::EngineMetrics& m) {
  return {.preemptions = m.preemptions,
          .prefix_cache_queries = m.prefix_cache_queries,
          .prefix_cache_hits = m.prefix_cache_hits,
          .prefix_cache_evictions = m.prefix_cache_evictions,
          .prefix_cache_pages = m.prefix_cache_pages};
}

// Attention rank a -> attention rank 0. Per request, its tokens come before its finish.
struct RelayUp {
  std::vector<RelayToken> tokens;
  std::vector<RelayFinish> finishes;
  int64_t running = 0, kv_pages_used = 0;  // after the step (or event) that sent this
  RelayEngineCounters counters;            // the rank's engine's, so far
  bool has_events() const { return !tokens.empty() || !finishes.empty(); }
};

// The bytes of each message and back (every rank runs the same process image: native byte order). A
// decode error names the message kind and what was malformed.
std::string encode_relay_down(const RelayDown& down);
Result<RelayDown> decode_relay_down(std::string_view bytes);
std::string encode_relay_up(const RelayUp& up);
Result<RelayUp> decode_relay_up(std::string_view bytes);

struct RelayOptions {
  std::vector<int> attention_world;     // world rank of attention rank a
  std::vector<std::string> rank_names;  // by world rank ("attention rank 1 (world rank 1)")
  int attention_rank = 0;               // this rank
  int64_t timeout_ms = 30000;           // AfdConfig::timeout_ms
  int64_t init_timeout_ms = 300000;     // AfdConfig::init_timeout_ms
};

// Attention rank 0's side: one link to each other attention rank.
class RelayHub {
 public:
  virtual ~RelayHub() = default;
  virtual int num_attention() const = 0;
  // Blocks until every other attention rank sent its first message (its engine is up), at most
  // init_timeout_ms; DeadlineExceeded names the ranks that did not.
  virtual Status wait_ready() = 0;
  // Posts `down` to attention rank a (1 <= a < num_attention()). Does not block: the send completes in
  // later calls (the hub keeps the bytes until then).
  virtual Status send(int a, const RelayDown& down) = 0;
  // Does not block: hands every message that arrived to `on_up(a, up)`, in arrival order per rank, and
  // checks the deadline of each rank that holds requests (sent to it and not reported finished).
  virtual Status poll(const std::function<void(int a, RelayUp&& up)>& on_up) = 0;
  // Blocks (timeout_ms) until every send posted up to the stop flag of its rank completed (what follows it
  // may never be read: a rank told to stop ends once it holds nothing).
  virtual Status flush() = 0;
};

// Attention rank a's side (a >= 1): its link to attention rank 0.
class RelayLink {
 public:
  virtual ~RelayLink() = default;
  // Posts `up` to attention rank 0; does not block (as RelayHub::send).
  virtual Status send(const RelayUp& up) = 0;
  // Does not block: moves what arrived since the last call into `down` (requests and cancels appended, the
  // flags of the latest message).
  virtual Status take(RelayDown* down) = 0;
  // Blocks at most `timeout` for a message from attention rank 0: kMine when one with requests, cancels or
  // the stopping flag arrived (take() returns it), kOther at once when `others` and the latest message said
  // another rank holds a request, else kTimeout. An error ends the rank.
  virtual Result<WorkWait> wait(std::chrono::milliseconds timeout, bool others) = 0;
  // Blocks (timeout_ms) until every posted send completed.
  virtual Status flush() = 0;
};

// Over `transport` (initialised; it must outlive the relay). Creating posts this rank's receives and
// touches no peer. InvalidArgument for a rank outside the options or for the wrong side.
Result<std::unique_ptr<RelayHub>> make_relay_hub(Transport& transport, RelayOptions options);
Result<std::unique_ptr<RelayLink>> make_relay_link(Transport& transport, RelayOptions options);

}  // namespace genbridge::afd
