#include "tools/serve/service.h"

#include <fmt/format.h>

#include <algorithm>

namespace genbridge::serve {

namespace {
constexpr size_t kMaxSamples = 1 << 20;  // observations kept for percentiles (the buckets count every one)
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard lk(mu_);
  const size_t b = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[b];
  sum_ += v;
  if (samples_.size() < kMaxSamples) samples_.push_back(v);
}

std::vector<double> Histogram::samples() const {
  std::lock_guard lk(mu_);
  return samples_;
}

std::string Histogram::prometheus(const std::string& name, const std::string& help, const std::string& labels) const {
  std::lock_guard lk(mu_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  const std::string pre = labels.empty() ? "" : labels + ",";
  const std::string own = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, pre, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{{}le=\"+Inf\"}} {}\n{}_sum{} {}\n{}_count{} {}\n", name, pre, cumulative, name, own,
                     sum_, name, own, cumulative);
  return out;
}

uint64_t StreamGroup::seq() const {
  std::lock_guard lk(mu_);
  return seq_;
}

uint64_t StreamGroup::wait(uint64_t seen, Clock::time_point deadline) {
  std::unique_lock lk(mu_);
  cv_.wait_until(lk, deadline, [&] { return seq_ != seen; });
  return seq_;
}

void StreamGroup::bump() {
  {
    std::lock_guard lk(mu_);
    ++seq_;
  }
  cv_.notify_all();
}

bool RequestStream::wait(Clock::time_point deadline, std::vector<int32_t>* tokens, engine::FinishReason* reason,
                         std::string* message, std::vector<engine::TokenLogprobs>* logprobs) {
  std::unique_lock lk(mu_);
  cv_.wait_until(lk, deadline, [&] { return done_ || !pending_.empty(); });
  tokens->insert(tokens->end(), pending_.begin(), pending_.end());
  pending_.clear();
  if (logprobs) {
    for (auto& lp : pending_logprobs_) logprobs->push_back(std::move(lp));
  }
  pending_logprobs_.clear();
  if (done_) {
    *reason = reason_;
    *message = message_;
  }
  return done_;
}

void RequestStream::push(int32_t token, const engine::TokenLogprobs* logprobs) {
  {
    std::lock_guard lk(mu_);
    pending_.push_back(token);
    if (logprobs) pending_logprobs_.push_back(*logprobs);
  }
  cv_.notify_all();
  if (group_) group_->bump();
}

void RequestStream::finish(engine::FinishReason reason, std::string message) {
  {
    std::lock_guard lk(mu_);
    done_ = true;
    reason_ = reason;
    message_ = std::move(message);
  }
  cv_.notify_all();
  if (group_) group_->bump();
}

GenerationService::GenerationService(engine::Engine& engine, runtime::KvPagePool& pool, const ServiceOptions& options)
    : GenerationService(WorkerPools{.workers = 1,
                                    .pages_per_worker = pool.num_pages(),
                                    .bytes_per_page = pool.geometry().bytes_per_page(),
                                    .state_slots_per_worker = pool.num_state_slots(),
                                    .bytes_per_state_slot = pool.geometry().state.bytes_per_slot(),
                                    .state_contents = pool.geometry().state.contents},
                        options) {
  pool_ = &pool;
  engine_ = &engine;
}

GenerationService::GenerationService(const WorkerPools& pools, const ServiceOptions& options)
    : options_(options),
      workers_(std::max(1, pools.workers)),
      local_workers_(pools.local_workers > 0 ? std::min(pools.local_workers, workers_) : workers_),
      inboxes_(static_cast<size_t>(workers_)),
      cancels_(static_cast<size_t>(workers_)),
      load_(static_cast<size_t>(workers_), 0),
      running_(static_cast<size_t>(workers_), 0),
      kv_used_(static_cast<size_t>(workers_), 0),
      engine_counters_(static_cast<size_t>(workers_)),
      remote_epoch_(static_cast<size_t>(workers_), 0),
      state_used_(static_cast<size_t>(workers_), 0),
      ttft_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      e2e_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}) {
  counters_.kv_pages_total = pools.pages_per_worker * workers_;
  counters_.kv_bytes_per_page = pools.bytes_per_page;
  counters_.state_slots_total = pools.state_slots_per_worker * workers_;
  counters_.bytes_per_state_slot = pools.bytes_per_state_slot;
  counters_.state_contents = pools.state_contents;
}

GenerationService::~GenerationService() {
  if (thread_.joinable()) shutdown(Clock::now());
}

void GenerationService::start() {
  if (!engine_) return;
  thread_ = std::thread([this] {
    // As before workers: sleep kIdleWait at most between looks for work; stop once shutting down and idle.
    (void)run_worker(0, *engine_, *pool_, [](bool want_stop, const WorkerWaitFn& wait) -> Result<bool> {
      if (want_stop) return true;
      wait(std::chrono::duration_cast<std::chrono::milliseconds>(kIdleWait), false);
      return false;
    });
  });
}

Result<std::shared_ptr<RequestStream>> GenerationService::submit(GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  GB_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams, submit_all(std::move(one)));
  return streams.front();
}

Result<std::vector<std::shared_ptr<RequestStream>>> GenerationService::submit_all(
    std::vector<GenerationRequest> requests) {
  std::vector<std::shared_ptr<RequestStream>> out;
  {
    std::lock_guard lk(mu_);
    if (stop_ || draining_) return unavailable("The server is shutting down and accepts no new requests.");
    if (!failure_.empty()) return unavailable("The engine failed and accepts no new requests: " + failure_);
    for (const GenerationRequest& request : requests) {
      if (options_.max_prompt_tokens > 0 && static_cast<int64_t>(request.prompt.size()) > options_.max_prompt_tokens) {
        return invalid_argument(fmt::format("The prompt has {} tokens but this server takes at most {} ({}).",
                                            request.prompt.size(), options_.max_prompt_tokens,
                                            options_.max_prompt_why));
      }
    }
    const auto wanted = static_cast<int64_t>(requests.size());
    if (counters_.queued + wanted > options_.max_queued_requests) {
      ++counters_.requests_rejected_queue_full;
      if (wanted == 1 || counters_.queued >= options_.max_queued_requests) {
        return resource_exhausted(
            fmt::format("The server's queue is full (--max-queued-requests {}: that many requests are waiting to "
                        "start); retry later.",
                        options_.max_queued_requests));
      }
      return resource_exhausted(fmt::format(
          "The server's queue has room for {} more sequences but this request needs {} (--max-queued-requests {}); "
          "retry later.",
          options_.max_queued_requests - counters_.queued, wanted, options_.max_queued_requests));
    }
    auto group = std::make_shared<StreamGroup>();
    for (GenerationRequest& request : requests) {
      const int64_t id = next_id_++;
      auto stream = std::make_shared<RequestStream>(id, group);
      const auto forced = static_cast<int64_t>(request.forced.size());
      engine::Request r{.id = id,
                        .prompt = std::move(request.prompt),
                        .max_new_tokens = request.max_tokens,
                        .stop_tokens = std::move(request.stop_tokens),
                        .sampling = std::move(request.sampling),
                        .logprobs = request.logprobs,
                        .forced = std::move(request.forced),
                        .constraint = std::move(request.constraint),
                        .priority = request.priority};
      // The least loaded worker that can take it (a request with a constraint: a local one), or the one its first
      // tokens name (ServiceOptions::route_by_first_tokens).
      const int n = r.constraint ? local_workers_ : workers_;
      int w = static_cast<int>(std::min_element(load_.begin(), load_.begin() + n) - load_.begin());
      const int64_t first = options_.route_by_first_tokens;
      if (first > 0 && n > 1 && static_cast<int64_t>(r.prompt.size()) > first) {
        uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the first tokens
        for (int64_t i = 0; i < first; ++i) h = (h ^ static_cast<uint32_t>(r.prompt[static_cast<size_t>(i)])) * 0x100000001b3ull;
        const int named = static_cast<int>(h % static_cast<uint64_t>(n));
        // Its cache, unless it holds a quarter batch (at least 2) more than the least loaded one, or it is full and
        // that one is not: elsewhere the prompt is computed again.
        const int64_t slack = std::max<int64_t>(2, options_.max_batch / 4);
        const bool named_full = load_[named] >= options_.max_batch, least_full = load_[w] >= options_.max_batch;
        if (load_[named] < load_[w] + slack && (!named_full || least_full)) w = named;
      }
      ++load_[w];
      const Clock::time_point now = Clock::now();
      entries_[id] = Entry{.stream = stream, .submitted = now, .last_token = now, .forced = forced, .worker = w};
      ++counters_.queued;
      ++counters_.requests_accepted;
      counters_.prompt_tokens += static_cast<int64_t>(r.prompt.size()) + forced;
      inboxes_[w].emplace_back(std::move(r), stream);
      if (streams_.size() >= 1024 && streams_.size() >= 2 * entries_.size()) {
        std::erase_if(streams_, [](const std::weak_ptr<RequestStream>& p) { return p.expired(); });
      }
      streams_.push_back(stream);
      out.push_back(std::move(stream));
    }
    wake_locked();
  }
  cv_.notify_all();
  return out;
}

void GenerationService::cancel(int64_t id) {
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;  // already ended
    cancels_[it->second.worker].push_back(id);
    wake_locked();
  }
  cv_.notify_all();
}

void GenerationService::stop(int64_t id) {
  {
    std::lock_guard lk(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return;
    it->second.stop_string = true;
    cancels_[it->second.worker].push_back(id);
    wake_locked();
  }
  cv_.notify_all();
}

int64_t GenerationService::in_flight() const {
  std::lock_guard lk(mu_);
  return static_cast<int64_t>(entries_.size());
}

ServiceCounters GenerationService::counters() const {
  std::lock_guard lk(mu_);
  ServiceCounters c = counters_;
  c.running = c.kv_pages_used = c.state_slots_used = 0;
  for (int w = 0; w < workers_; ++w) {
    c.running += running_[w];
    c.kv_pages_used += kv_used_[w];
    c.engine += engine_counters_[w];
    c.state_slots_used += state_used_[w];
  }
  return c;
}

int64_t GenerationService::shutdown(Clock::time_point deadline) {
  draining_ = true;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    wake_locked();
  }
  cv_.notify_all();
  int64_t aborted = 0;
  while (in_flight() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    std::lock_guard lk(mu_);
    if (!entries_.empty()) {
      aborted = static_cast<int64_t>(entries_.size());
      ++abort_epoch_;
      wake_locked();
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  return aborted;
}

void GenerationService::fail_locked(const std::string& message) {
  if (!failure_.empty()) return;
  failure_ = message;
  for (auto& [id, e] : entries_) e.stream->finish(engine::FinishReason::kError, "the engine failed: " + failure_);
  entries_.clear();
  std::fill(load_.begin(), load_.end(), 0);
  counters_.queued = 0;
  wake_locked();
}

void GenerationService::fail(const std::string& message) {
  {
    std::lock_guard lk(mu_);
    fail_locked(message);
  }
  cv_.notify_all();
}

bool GenerationService::wait_streams_released(Clock::time_point deadline) {
  for (;;) {
    {
      std::lock_guard lk(mu_);
      std::erase_if(streams_, [](const std::weak_ptr<RequestStream>& p) { return p.expired(); });
      if (streams_.empty()) return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void GenerationService::dequeue(Entry& e) {
  if (e.counted_queued) {
    e.counted_queued = false;
    --counters_.queued;
  }
}

void GenerationService::on_token(int64_t id, int32_t token, const engine::TokenLogprobs* logprobs) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  const Clock::time_point now = Clock::now();
  if (e.tokens == 0) dequeue(e);  // running
  if (e.tokens < e.forced) {
    // A prompt token fed for its logprobs: neither generated nor timed.
  } else if (e.tokens == e.forced) {
    ttft_.observe(seconds(now - e.submitted));
    ++counters_.generation_tokens;
  } else {
    tpot_.observe(seconds(now - e.last_token));
    ++counters_.generation_tokens;
  }
  e.last_token = now;
  ++e.tokens;
  e.stream->push(token, logprobs);
}

void GenerationService::on_finish(engine::RequestResult&& r) {
  std::lock_guard lk(mu_);
  auto it = entries_.find(r.id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  dequeue(e);
  switch (r.reason) {
    case engine::FinishReason::kStop:
      ++counters_.finished_stop;
      break;
    case engine::FinishReason::kLength:
      ++counters_.finished_length;
      break;
    case engine::FinishReason::kCancelled:
      ++(e.stop_string ? counters_.finished_stop : counters_.finished_cancelled);
      break;
    case engine::FinishReason::kRefused:
      ++counters_.finished_refused;
      break;
    case engine::FinishReason::kError:
      ++counters_.finished_error;
      break;
  }
  e2e_.observe(seconds(Clock::now() - e.submitted));
  e.stream->finish(r.reason, std::move(r.message));
  --load_[e.worker];
  entries_.erase(it);
}

afd::RelayDown GenerationService::take_remote_work(int w) {
  std::lock_guard lk(mu_);
  afd::RelayDown out;
  for (auto& [req, stream] : inboxes_[w]) out.submit.push_back(std::move(req));
  inboxes_[w].clear();
  out.cancel.swap(cancels_[w]);
  if (remote_epoch_[w] != abort_epoch_) {
    remote_epoch_[w] = abort_epoch_;
    for (const auto& [id, e] : entries_) {
      if (e.worker == w) out.cancel.push_back(id);
    }
  }
  out.stopping = stop_;
  for (int o = 0; o < workers_; ++o) out.others_busy = out.others_busy || (o != w && load_[o] > 0);
  return out;
}

void GenerationService::remote_gauges(int w, int64_t running, int64_t kv_pages_used, const EngineCounters& counters) {
  std::lock_guard lk(mu_);
  running_[w] = running;
  kv_used_[w] = kv_pages_used;
  engine_counters_[w] = counters;
}

int64_t GenerationService::unfinished(int w) const {
  std::lock_guard lk(mu_);
  return load_[w];
}

Status GenerationService::run_worker(int w, engine::Engine& eng, runtime::KvPagePool& pool, const WorkerIdleFn& idle,
                                     const std::function<Status()>& each_round) {
  eng.set_listener({.on_token = [this](int64_t id, int32_t t, const engine::TokenLogprobs* lp) { on_token(id, t, lp); },
                    .on_finish = [this](engine::RequestResult&& r) { on_finish(std::move(r)); }});
  uint64_t seen_epoch = 0, seen_seq = 0;
  {
    std::lock_guard lk(mu_);
    seen_epoch = abort_epoch_;
  }
  // Something for this worker, or the service stopping or failing (mu_ held).
  auto mine = [&] {
    return !inboxes_[w].empty() || !cancels_[w].empty() || abort_epoch_ != seen_epoch || stop_ || !failure_.empty();
  };
  // Another worker has an unfinished request (mu_ held).
  auto others_busy = [&] {
    for (int o = 0; o < workers_; ++o) {
      if (o != w && load_[o] > 0) return true;
    }
    return false;
  };
  const WorkerWaitFn wait = [&](std::chrono::milliseconds timeout, bool others) {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return wake_seq_ != seen_seq || (others && others_busy()); })) {
      return WorkWait::kTimeout;
    }
    seen_seq = wake_seq_;
    return mine() ? WorkWait::kMine : WorkWait::kOther;
  };
  auto publish = [&] {
    std::lock_guard lk(mu_);
    running_[w] = eng.num_running();
    kv_used_[w] = pool.used_pages();
    engine_counters_[w] = afd::engine_counters(eng.metrics());
    state_used_[w] = pool.num_state_slots() - pool.free_state_slots();
  };
  Status result;
  for (;;) {
    if (each_round) {
      if (Status s = each_round(); !s.ok()) {
        fail(s.to_string());
        result = s;
        break;
      }
    }
    Inbox in;
    std::vector<int64_t> cancels, abort_ids;
    bool stopping = false;
    {
      std::lock_guard lk(mu_);
      if (!failure_.empty()) {
        result = unavailable("another part of the server failed: " + failure_);
        break;
      }
      in.swap(inboxes_[w]);
      cancels.swap(cancels_[w]);
      if (abort_epoch_ != seen_epoch) {
        seen_epoch = abort_epoch_;
        for (const auto& [id, e] : entries_) {
          if (e.worker == w) abort_ids.push_back(id);
        }
      }
      seen_seq = wake_seq_;
      stopping = stop_;
    }
    for (auto& [req, stream] : in) {
      const int64_t id = req.id;
      if (Status s = eng.submit(std::move(req)); !s.ok()) {
        on_finish(engine::RequestResult{.id = id, .reason = engine::FinishReason::kError, .message = s.message()});
      }
    }
    for (int64_t id : cancels) eng.cancel(id);
    for (int64_t id : abort_ids) eng.cancel(id);
    if (eng.has_work()) {
      const Status s = eng.step();
      publish();
      if (!s.ok()) {
        fail(s.to_string());
        result = s;
        break;
      }
      continue;
    }
    publish();
    const Result<bool> stop = idle(stopping, wait);
    if (!stop.ok()) {
      fail(stop.status().to_string());
      result = stop.status();
      break;
    }
    if (*stop) break;
  }
  publish();
  return result;
}

}  // namespace genbridge::serve
