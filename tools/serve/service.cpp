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

std::string Histogram::prometheus(const std::string& name, const std::string& help) const {
  std::lock_guard lk(mu_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cumulative, name, sum_, name,
                     cumulative);
  return out;
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
}

void RequestStream::finish(engine::FinishReason reason, std::string message) {
  {
    std::lock_guard lk(mu_);
    done_ = true;
    reason_ = reason;
    message_ = std::move(message);
  }
  cv_.notify_all();
}

GenerationService::GenerationService(engine::ForwardExecutor& executor, runtime::KvPagePool& pool,
                                     const ServiceOptions& options)
    : executor_(executor),
      pool_(pool),
      options_(options),
      ttft_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      e2e_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}) {
  engine_ = std::make_unique<engine::Engine>(executor_, pool_, engine::EngineOptions{.max_batch = options_.max_batch});
  engine_->set_listener(
      {.on_token = [this](int64_t id, int32_t t, const engine::TokenLogprobs* lp) { on_token(id, t, lp); },
       .on_finish = [this](engine::RequestResult&& r) { on_finish(std::move(r)); }});
  counters_.kv_pages_total = pool_.num_pages();
  counters_.kv_bytes_per_page = pool_.geometry().bytes_per_page();
}

GenerationService::~GenerationService() {
  if (thread_.joinable()) shutdown(Clock::now());
}

void GenerationService::start() {
  thread_ = std::thread([this] { engine_loop(); });
}

Result<std::shared_ptr<RequestStream>> GenerationService::submit(GenerationRequest request) {
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard lk(mu_);
    if (stop_ || draining_) return unavailable("The server is shutting down and accepts no new requests.");
    if (!failure_.empty()) return unavailable("The engine failed and accepts no new requests: " + failure_);
    if (counters_.queued >= options_.max_queued_requests) {
      ++counters_.requests_rejected_queue_full;
      return resource_exhausted(
          fmt::format("The server's queue is full (--max-queued-requests {}: that many requests are waiting to "
                      "start); retry later.",
                      options_.max_queued_requests));
    }
    const int64_t id = next_id_++;
    stream = std::make_shared<RequestStream>(id);
    engine::Request r{.id = id,
                      .prompt = std::move(request.prompt),
                      .max_new_tokens = request.max_tokens,
                      .stop_tokens = std::move(request.stop_tokens),
                      .sampling = request.sampling,
                      .logprobs = request.logprobs};
    const Clock::time_point now = Clock::now();
    entries_[id] = Entry{.stream = stream, .submitted = now, .last_token = now};
    ++counters_.queued;
    ++counters_.requests_accepted;
    counters_.prompt_tokens += static_cast<int64_t>(r.prompt.size());
    inbox_.emplace_back(std::move(r), stream);
  }
  cv_.notify_all();
  return stream;
}

void GenerationService::cancel(int64_t id) {
  {
    std::lock_guard lk(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void GenerationService::stop(int64_t id) {
  {
    std::lock_guard lk(mu_);
    if (auto it = entries_.find(id); it != entries_.end()) it->second.stop_string = true;
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

int64_t GenerationService::in_flight() const {
  std::lock_guard lk(mu_);
  return static_cast<int64_t>(entries_.size());
}

ServiceCounters GenerationService::counters() const {
  std::lock_guard lk(mu_);
  return counters_;
}

int64_t GenerationService::shutdown(Clock::time_point deadline) {
  draining_ = true;
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  int64_t aborted = 0;
  while (in_flight() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    std::lock_guard lk(mu_);
    if (!entries_.empty()) {
      aborted = static_cast<int64_t>(entries_.size());
      abort_all_ = true;
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  return aborted;
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
  if (e.tokens == 0) {
    ttft_.observe(seconds(now - e.submitted));
    dequeue(e);
  } else {
    tpot_.observe(seconds(now - e.last_token));
  }
  e.last_token = now;
  ++e.tokens;
  ++counters_.generation_tokens;
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
  entries_.erase(it);
}

void GenerationService::engine_loop() {
  while (true) {
    std::vector<std::pair<engine::Request, std::shared_ptr<RequestStream>>> in;
    std::vector<int64_t> cancels;
    std::vector<int64_t> abort_ids;
    {
      std::unique_lock lk(mu_);
      if (inbox_.empty() && cancels_.empty() && !abort_all_ && !engine_->has_work()) {
        if (stop_) break;
        cv_.wait_for(lk, kIdleWait);
        continue;
      }
      in.swap(inbox_);
      cancels.swap(cancels_);
      if (abort_all_) {
        for (const auto& [id, e] : entries_) abort_ids.push_back(id);
        abort_all_ = false;
      }
    }
    for (auto& [req, stream] : in) {
      const int64_t id = req.id;
      if (Status s = engine_->submit(std::move(req)); !s.ok()) {
        engine::RequestResult r{.id = id, .reason = engine::FinishReason::kError, .message = s.message()};
        on_finish(std::move(r));
      }
    }
    for (int64_t id : cancels) engine_->cancel(id);
    for (int64_t id : abort_ids) engine_->cancel(id);
    if (engine_->has_work()) {
      if (Status s = engine_->step(); !s.ok()) {
        std::lock_guard lk(mu_);
        failure_ = s.to_string();
        for (auto& [id, e] : entries_) e.stream->finish(engine::FinishReason::kError, "the engine failed: " + failure_);
        entries_.clear();
        counters_.queued = 0;
        break;
      }
    }
    std::lock_guard lk(mu_);
    counters_.running = engine_->num_running();
    counters_.kv_pages_used = pool_.used_pages();
  }
  std::lock_guard lk(mu_);
  counters_.running = 0;
  counters_.kv_pages_used = pool_.used_pages();
}

}  // namespace genbridge::serve
