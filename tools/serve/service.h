#pragma once
// GenerationService: the continuous-batching engine behind `genbridge serve`. One engine thread owns the
// engine; HTTP threads submit requests through a bounded queue and read each request's tokens from its
// RequestStream as the engine generates them. Concurrent requests share decode steps (and get the tokens
// they would get alone: the kernels are batch-invariant).
//
// With --afd the service feeds several engines (workers), one per attention rank, each driven by its rank's
// thread through run_worker(): a request goes to the worker with the fewest unfinished requests (the
// lowest index on a tie), and stays there. Under mpirun with several attention ranks only worker 0 runs in
// this process; the others are remote workers, which the relay of worker 0's thread feeds
// (take_remote_work) and whose engines' reports it hands back (remote_token, remote_finish, remote_gauges).
//
// Every wait is bounded: the engine thread sleeps at most kIdleWait between checks (a worker: what its idle
// function decides), and readers pass a deadline to RequestStream::wait.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "afd/serve_relay.h"
#include "afd/work_wait.h"
#include "genbridge/core/status.h"
#include "runtime/engine/engine.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::serve {

using Clock = std::chrono::steady_clock;

// Prometheus histogram with fixed upper bounds (seconds). Thread-safe.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // "# TYPE name histogram" and the _bucket / _sum / _count lines; `labels` (e.g. `model_name="m"`) go into
  // every line's braces.
  std::string prometheus(const std::string& name, const std::string& help, const std::string& labels = "") const;
  std::vector<double> samples() const;  // every observation (the load test's percentiles)

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  std::vector<double> samples_;
};

// What the streams of one HTTP request share: a counter bumped by every push and finish of any of them, so
// that the thread serving the request waits for whichever of its choices moves first.
class StreamGroup {
 public:
  uint64_t seq() const;
  // Waits until seq() differs from `seen` or `deadline` passes; returns seq().
  uint64_t wait(uint64_t seen, Clock::time_point deadline);
  void bump();

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t seq_ = 0;
};

// The tokens of one request, from the engine thread to the HTTP thread that serves it.
class RequestStream {
 public:
  explicit RequestStream(int64_t id, std::shared_ptr<StreamGroup> group = nullptr)
      : id_(id), group_(std::move(group)) {}
  int64_t id() const { return id_; }
  // The group of the HTTP request's streams (never null for a stream the service handed out).
  const std::shared_ptr<StreamGroup>& group() const { return group_; }
  // Moves the tokens generated since the last call into `tokens`; true once the request has ended (then
  // `reason` and `message` say how). Waits until there is something new or `deadline` passes. `logprobs`
  // (optional) receives the tokens' log-probabilities, one per token, when the request asked for them.
  bool wait(Clock::time_point deadline, std::vector<int32_t>* tokens, engine::FinishReason* reason,
            std::string* message, std::vector<engine::TokenLogprobs>* logprobs = nullptr);
  // Engine thread side. `logprobs`: nullptr unless the request asked for them.
  void push(int32_t token, const engine::TokenLogprobs* logprobs);
  void finish(engine::FinishReason reason, std::string message);

 private:
  const int64_t id_;
  std::shared_ptr<StreamGroup> group_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> pending_;
  std::vector<engine::TokenLogprobs> pending_logprobs_;
  bool done_ = false;
  engine::FinishReason reason_ = engine::FinishReason::kLength;
  std::string message_;
};

struct ServiceOptions {
  int64_t max_batch = 32;
  int64_t max_queued_requests = 256;  // accepted requests not yet started; more -> ResourceExhausted
  // Longer prompts are refused at submit (InvalidArgument naming both numbers and `max_prompt_why`); 0: no
  // limit here (the HTTP layer checks the context).
  int64_t max_prompt_tokens = 0;
  std::string max_prompt_why;
  // More Prometheus text for /metrics (e.g. the AFD counters); empty: none.
  std::function<std::string()> extra_metrics;
  // Prefix caching with several workers (each its own cache): > 0 sends a prompt of more than this many tokens to
  // the worker its first this-many tokens name (so a chat's turns and requests sharing a system prompt meet their
  // cached pages), unless that worker holds a quarter batch (at least 2) more requests than the least loaded one,
  // or holds max_batch and the least loaded one does not. 0: always the least loaded.
  int64_t route_by_first_tokens = 0;
};

// Engines driven by other threads (AFD attention ranks): how many, and the KV pool of each.
struct WorkerPools {
  int workers = 1;
  // Workers 0 .. local_workers - 1 run in this process; the others are relayed to other processes
  // (afd/serve_relay.h), which cannot take a request with a token constraint: such a request goes to a local
  // worker. 0: every worker is local.
  int local_workers = 0;
  int64_t pages_per_worker = 0, bytes_per_page = 0;
  // A model with per-sequence state: each pool's state slots, their bytes and what they hold (the geometry's
  // StateSlotGeometry::contents); 0 slots otherwise.
  int64_t state_slots_per_worker = 0, bytes_per_state_slot = 0;
  std::string state_contents;
};

// What a worker's wait for work saw (see WorkerIdleFn): the AFD attention ranks' own vocabulary.
using WorkWait = afd::WorkWait;
// Called by run_worker whenever its engine has no work: `want_stop` says the service is shutting down and
// holds nothing more for this worker; `wait(timeout, others)` blocks at most `timeout` for something to
// happen (with `others`: returns kOther at once while another worker has an unfinished request, as a
// lockstep worker must step beside it). Returns true to end the worker, false to look for work again; an
// error ends the worker (and fails the service).
using WorkerWaitFn = std::function<WorkWait(std::chrono::milliseconds timeout, bool others)>;
using WorkerIdleFn = std::function<Result<bool>(bool want_stop, const WorkerWaitFn& wait)>;

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  engine::SamplingParams sampling;
  std::vector<int32_t> stop_tokens;
  int logprobs = -1;                                    // engine::Request::logprobs
  std::vector<int32_t> forced;                          // engine::Request::forced (a prompt fed for its logprobs)
  std::shared_ptr<engine::TokenConstraint> constraint;  // engine::Request::constraint (one per sequence)
  int32_t priority = 0;                                 // engine::Request::priority
};

// What a worker's engine has counted so far (engine::EngineMetrics), as the service publishes it.
using EngineCounters = afd::RelayEngineCounters;

// Counters and gauges for /metrics.
struct ServiceCounters {
  int64_t requests_accepted = 0, requests_rejected_queue_full = 0;
  int64_t finished_stop = 0, finished_length = 0, finished_cancelled = 0, finished_error = 0, finished_refused = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t queued = 0, running = 0;
  // Every worker's engine counters, summed: preemptions (--preemption recompute) and the prefix cache's tokens of
  // started requests, of them found in the cache, pages evicted and pages cached.
  EngineCounters engine;
  int64_t kv_pages_used = 0, kv_pages_total = 0, kv_bytes_per_page = 0;
  // Per-sequence state slots (a model with state; total 0 otherwise) and what they hold.
  int64_t state_slots_used = 0, state_slots_total = 0, bytes_per_state_slot = 0;
  std::string state_contents;
};

class GenerationService {
 public:
  // `engine` (over `pool`, no request submitted yet) and `pool` must outlive the service; start() launches the
  // engine thread, which then owns the engine.
  GenerationService(engine::Engine& engine, runtime::KvPagePool& pool, const ServiceOptions& options);
  // Workers mode: no engine of its own; `pools.workers` threads each call run_worker() with their engine.
  GenerationService(const WorkerPools& pools, const ServiceOptions& options);
  ~GenerationService();
  void start();  // the engine thread (not in workers mode)

  // Workers mode: drives `engine` (over `pool`) as worker `w` until `idle` says stop (OK) or the engine or
  // `idle` fails: then every unfinished request ends with that error, new ones get Unavailable, the other
  // workers end too (Unavailable), and the error is returned. Sets the engine's listener. `each_round`
  // (optional) runs on this thread before every look for work; its error fails the worker the same way.
  Status run_worker(int w, engine::Engine& engine, runtime::KvPagePool& pool, const WorkerIdleFn& idle,
                    const std::function<Status()>& each_round = {});
  // Workers mode, remote worker `w`: what was queued for it since the last call, to forward (requests in
  // the order accepted; cancels, and once the shutdown deadline passed every request it holds); `stopping`:
  // the service accepts nothing more; `others_busy`: another worker holds a request. One caller thread.
  afd::RelayDown take_remote_work(int w);
  // What remote worker `w`'s engine reported, as run_worker's listener hands it on.
  void remote_token(int64_t id, int32_t token, const engine::TokenLogprobs* logprobs) { on_token(id, token, logprobs); }
  void remote_finish(engine::RequestResult&& result) { on_finish(std::move(result)); }
  void remote_gauges(int w, int64_t running, int64_t kv_pages_used, const EngineCounters& counters);
  // Requests of worker `w` that have not ended (queued or running).
  int64_t unfinished(int w) const;
  // Fails the service from outside (e.g. the job around the workers failed): as a worker's failure.
  void fail(const std::string& message);
  // Waits until no RequestStream handed out is referenced any more (every HTTP handler has finished its
  // reply) or `deadline` passes; true when none is.
  bool wait_streams_released(Clock::time_point deadline);
  std::string extra_metrics_text() const { return options_.extra_metrics ? options_.extra_metrics() : ""; }

  // Queues a request: ResourceExhausted when max_queued_requests are already waiting, Unavailable while
  // shutting down (or after an engine failure), InvalidArgument for what the engine refuses at submit.
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // Queues every one of `requests` (the choices of one HTTP request) or none: ResourceExhausted when the queue
  // lacks room for all of them. Their streams share one StreamGroup.
  Result<std::vector<std::shared_ptr<RequestStream>>> submit_all(std::vector<GenerationRequest> requests);
  // Asks the engine thread to end request `id` (it reaches its stream as kCancelled); frees its KV pages.
  void cancel(int64_t id);
  // The same for a request whose text reached a stop string: counted as finished by "stop", not cancelled.
  void stop(int64_t id);
  // Stops accepting (Unavailable), lets in-flight requests finish until `deadline`, cancels the rest, and
  // joins the engine thread. Returns how many requests were cancelled at the deadline.
  int64_t shutdown(Clock::time_point deadline);
  bool draining() const { return draining_.load(); }
  // The engine's forward failed: every request then ended with an error and new ones get Unavailable.
  bool failed() const {
    std::lock_guard lk(mu_);
    return !failure_.empty();
  }
  std::string failure() const {
    std::lock_guard lk(mu_);
    return failure_;
  }
  int64_t in_flight() const;

  ServiceCounters counters() const;
  const Histogram& ttft() const { return ttft_; }
  const Histogram& tpot() const { return tpot_; }
  const Histogram& e2e() const { return e2e_; }

  static constexpr auto kIdleWait = std::chrono::milliseconds(50);

 private:
  struct Entry {
    std::shared_ptr<RequestStream> stream;
    Clock::time_point submitted, last_token;
    int64_t tokens = 0;
    int64_t forced = 0;  // tokens fed for their logprobs (a prompt's): not generated ones
    int worker = 0;
    bool counted_queued = true;
    bool stop_string = false;  // ended by stop(): a stop string in its text
  };
  void on_token(int64_t id, int32_t token, const engine::TokenLogprobs* logprobs);
  void on_finish(engine::RequestResult&& result);
  void dequeue(Entry& e);
  void fail_locked(const std::string& message);
  void wake_locked() { ++wake_seq_; }  // then cv_.notify_all() after unlocking

  ServiceOptions options_;
  const int workers_;
  const int local_workers_;              // WorkerPools::local_workers (workers_ when every worker is local)
  runtime::KvPagePool* pool_ = nullptr;  // monolithic
  engine::Engine* engine_ = nullptr;     // monolithic: engine thread only (after start)
  std::thread thread_;

  mutable std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  using Inbox = std::vector<std::pair<engine::Request, std::shared_ptr<RequestStream>>>;
  std::vector<Inbox> inboxes_;                         // per worker
  std::vector<std::vector<int64_t>> cancels_;          // per worker
  std::vector<int64_t> load_;                          // per worker: unfinished requests
  std::vector<int64_t> running_, kv_used_;             // per worker, as last published
  // Per worker: its engine's counters (preemptions, prefix cache), as last published.
  std::vector<EngineCounters> engine_counters_;
  std::vector<uint64_t> remote_epoch_;                 // per remote worker: the abort_epoch_ take_remote_work last saw
  std::unordered_map<int64_t, Entry> entries_;         // every accepted, unfinished request
  std::vector<std::weak_ptr<RequestStream>> streams_;  // handed out (wait_streams_released)
  std::vector<int64_t> state_used_;                    // per worker: state slots in use, as last published
  int64_t next_id_ = 0;
  uint64_t wake_seq_ = 0;     // bumped by everything a waiting worker must see
  uint64_t abort_epoch_ = 0;  // bumped when shutdown cancels every request
  bool stop_ = false;
  std::string failure_;  // the engine's error, once it failed
  ServiceCounters counters_;

  std::atomic<bool> draining_{false};
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace genbridge::serve
