#include "tools/serve_afd.h"

#include <algorithm>
#include <vector>

namespace genbridge::tools {

namespace {

// How often attention rank 0 polls the relay while it waits for work and another attention rank holds
// requests (their tokens reach the clients no later than this after they arrive).
constexpr auto kRelayPoll = std::chrono::milliseconds(1);

// Attention rank 0 of a relayed job: the service's workers 1..A-1 are the other attention ranks, fed
// through `relay` on this rank's thread, between its own steps and while it waits.
class RelayedWorkers {
 public:
  RelayedWorkers(serve::GenerationService& service, afd::RelayHub& relay)
      : service_(service), relay_(relay), sent_(static_cast<size_t>(relay.num_attention())) {}

  // Forwards what the service queued for the other ranks, then hands their reports to the service.
  Status pump() {
    GB_RETURN_IF_ERROR(error_);
    for (int a = 1; a < relay_.num_attention(); ++a) {
      afd::RelayDown work = service_.take_remote_work(a);
      Sent& sent = sent_[a];
      // Once a rank was told the server stops, it may end as soon as it holds nothing: then only what it
      // holds (cancels) is worth a message.
      const bool flags_changed =
          !sent.stopping && (work.stopping != sent.stopping || work.others_busy != sent.others_busy);
      if (work.submit.empty() && work.cancel.empty() && !flags_changed) continue;
      sent = {.stopping = sent.stopping || work.stopping, .others_busy = work.others_busy};
      GB_RETURN_IF_ERROR(relay_.send(a, work));
    }
    return relay_.poll([this](int a, afd::RelayUp&& up) {
      for (afd::RelayToken& t : up.tokens) service_.remote_token(t.id, t.token, t.has_logprobs ? &t.logprobs : nullptr);
      for (afd::RelayFinish& f : up.finishes) {
        service_.remote_finish({.id = f.id, .reason = f.reason, .message = std::move(f.message)});
      }
      service_.remote_gauges(a, up.running, up.kv_pages_used, up.counters);
    });
  }

  // Whether another attention rank holds requests.
  bool busy() const {
    for (int a = 1; a < relay_.num_attention(); ++a) {
      if (service_.unfinished(a) > 0) return true;
    }
    return false;
  }

  // Worker 0's wait: `wait` in slices of kRelayPoll while another rank holds requests, relaying between
  // them. Returns kMine as soon as the server stops (`want_stop`) and no other rank holds requests any
  // more, so that worker 0 may stop too; and on a relay error, which the next pump() returns.
  serve::WorkWait wait(const serve::WorkerWaitFn& wait, std::chrono::milliseconds timeout, bool others,
                       bool want_stop) {
    const serve::Clock::time_point deadline = serve::Clock::now() + timeout;
    for (;;) {
      if (Status s = pump(); !s.ok()) {
        error_ = s;
        return serve::WorkWait::kMine;
      }
      const bool remote_busy = busy();
      if (want_stop && !remote_busy) return serve::WorkWait::kMine;
      const serve::Clock::time_point now = serve::Clock::now();
      if (now >= deadline) return serve::WorkWait::kTimeout;
      auto slice = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
      if (remote_busy) slice = std::min<std::chrono::milliseconds>(slice, kRelayPoll);
      const serve::WorkWait w = wait(slice, others);
      if (w != serve::WorkWait::kTimeout) {
        if (Status s = pump(); !s.ok()) error_ = s;
        return w;
      }
    }
  }

 private:
  struct Sent {
    bool stopping = false, others_busy = false;
  };
  serve::GenerationService& service_;
  afd::RelayHub& relay_;
  std::vector<Sent> sent_;  // by attention rank: the flags of the last message sent to it
  Status error_;
};

Status run_relaying_worker(serve::GenerationService& service, afd::RelayHub& relay, engine::Engine& eng,
                           runtime::KvPagePool& pool, afd::AttentionIdle& idle) {
  RelayedWorkers remote(service, relay);
  const serve::WorkerIdleFn idle_fn = [&](bool want_stop, const serve::WorkerWaitFn& wait) -> Result<bool> {
    return idle.idle(want_stop && !remote.busy(), [&](std::chrono::milliseconds timeout, bool others) {
      return remote.wait(wait, timeout, others, want_stop);
    });
  };
  return service.run_worker(0, eng, pool, idle_fn, [&] { return remote.pump(); });
}

}  // namespace

afd::AttentionServeFn service_worker_fn(serve::GenerationService& service) {
  return [&service](int a, engine::Engine& eng, runtime::KvPagePool& pool, afd::AttentionIdle& idle,
                    afd::RelayHub* relay) -> Status {
    Status s = relay != nullptr
                   ? run_relaying_worker(service, *relay, eng, pool, idle)
                   : service.run_worker(a, eng, pool, [&idle](bool want_stop, const serve::WorkerWaitFn& wait) {
                       return idle.idle(want_stop, wait);
                     });
    if (!s.ok()) service.wait_streams_released(serve::Clock::now() + std::chrono::seconds(5));
    return s;
  };
}

}  // namespace genbridge::tools
