#include "afd/serve_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "afd/job.h"
#include "afd/rank_job.h"
#include "afd/runner.h"
#include "afd/transports/step_agreement.h"

namespace genbridge::afd {

int64_t keep_alive_ms(const AfdConfig& cfg) { return std::max<int64_t>(1, cfg.timeout_ms / 4); }

int64_t max_prompt_tokens(const ServeJobOptions& options) {
  return std::max<int64_t>(1, options.engine.max_prefill_tokens);
}

Status AttentionIdle::empty_step() {
  GB_RETURN_IF_ERROR(executor_.empty_step());
  if (after_step_) after_step_();
  return ok_status();
}

Result<bool> AttentionIdle::idle(bool want_stop,
                                 const std::function<WorkWait(std::chrono::milliseconds, bool others)>& wait) {
  StepAgreement* agreement = executor_.agreement();
  if (agreement == nullptr) {
    // This rank steps on its own: an empty step once keep_alive_ms passed since its last step.
    if (want_stop) return true;
    const int64_t due = executor_.last_step_ns() + keep_alive_ms_ * 1'000'000;
    const int64_t now = now_ns();
    if (now < due) {
      const auto left = std::chrono::milliseconds((due - now + 999'999) / 1'000'000);
      if (wait(left, false) != WorkWait::kTimeout || now_ns() < due) return false;  // the loop looks again
    }
    GB_RETURN_IF_ERROR(empty_step());
    ++keep_alive_steps_;
    return false;
  }
  // Lockstep: sleep only while every rank was idle at the last agreement; something for this rank goes
  // back to the loop, whose engine step agrees with the others (AfdExecutor::forward). A rank that stepped
  // since its last idle call had work at that step's agreement: every other rank is then in the lockstep
  // rounds (stepping, or agreeing without sleeping), so it joins the next round at once instead of sleeping
  // while they wait for it in that round (which would hold back their next request until its keep-alive).
  if (executor_.steps() != steps_seen_) others_active_ = true;
  if (!others_active_ && !want_stop && wait(std::chrono::milliseconds(keep_alive_ms_), true) == WorkWait::kMine) {
    steps_seen_ = executor_.steps();
    return false;
  }
  GB_ASSIGN_OR_RETURN(const bool any_work, agreement->any_active(false));
  if (any_work) {
    others_active_ = true;
    GB_RETURN_IF_ERROR(empty_step());  // beside the others' step
    steps_seen_ = executor_.steps();
    return false;
  }
  others_active_ = false;
  GB_ASSIGN_OR_RETURN(const bool go_on, agreement->any_active(!want_stop));
  steps_seen_ = executor_.steps();
  if (!go_on) return true;
  GB_RETURN_IF_ERROR(empty_step());  // every rank: the keep-alive
  ++keep_alive_steps_;
  steps_seen_ = executor_.steps();
  return false;
}

std::string ServeLiveMetrics::prometheus(bool ffn_here) const {
  std::string o;
  auto counter = [&](const char* name, const char* help, const char* labels, int64_t v, bool head) {
    if (head) o += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
    o += fmt::format("{}{} {}\n", name, labels, v);
  };
  counter("genbridge_afd_steps_total",
          "AFD steps of the attention ranks: prefill, decode, and empty steps (keep-alive while idle, or beside "
          "another lockstep rank's step).",
          "{kind=\"prefill\"}", prefill_steps.load(), true);
  counter("genbridge_afd_steps_total", "", "{kind=\"decode\"}", decode_steps.load(), false);
  counter("genbridge_afd_steps_total", "", "{kind=\"empty\"}", empty_steps.load(), false);
  counter("genbridge_afd_transfer_bytes_total", "Bytes of AFD transfers received, by direction.",
          "{direction=\"ffn_to_attention\"}", ffn_to_attention_bytes.load(), true);
  if (ffn_here) {
    counter("genbridge_afd_transfer_bytes_total", "", "{direction=\"attention_to_ffn\"}", attention_to_ffn_bytes.load(),
            false);
  }
  counter("genbridge_afd_transfer_messages_total", "AFD transfers received, by direction.",
          "{direction=\"ffn_to_attention\"}", ffn_to_attention_messages.load(), true);
  if (ffn_here) {
    counter("genbridge_afd_transfer_messages_total", "", "{direction=\"attention_to_ffn\"}",
            attention_to_ffn_messages.load(), false);
  }
  o += fmt::format(
      "# HELP genbridge_afd_attention_wait_seconds_total Time attention ranks waited for expert outputs.\n"
      "# TYPE genbridge_afd_attention_wait_seconds_total counter\ngenbridge_afd_attention_wait_seconds_total {}\n",
      static_cast<double>(attention_wait_ns.load()) * 1e-9);
  if (ffn_here) {
    o += fmt::format(
        "# HELP genbridge_afd_ffn_busy_seconds_total Time FFN ranks spent computing experts.\n"
        "# TYPE genbridge_afd_ffn_busy_seconds_total counter\ngenbridge_afd_ffn_busy_seconds_total {}\n",
        static_cast<double>(ffn_busy_ns.load()) * 1e-9);
    counter("genbridge_afd_ffn_work_items_total", "Work items (one layer and stage of a step) FFN ranks served.", "",
            ffn_items.load(), true);
    for (int e = 0; e < num_experts; ++e) {
      counter("genbridge_afd_expert_rows_total",
              "Rows (token, top-k slot pairs) FFN ranks computed per expert, every MoE layer together.",
              fmt::format("{{expert=\"{}\"}}", e).c_str(), expert_rows[static_cast<size_t>(e)].load(), e == 0);
    }
  }
  return o;
}

namespace {

// Sums of one direction's transfers over every layer and stage.
void transfer_totals(const Metrics& m, Direction d, int64_t* bytes, int64_t* messages) {
  *bytes = *messages = 0;
  for (int l = 0; l < m.num_layers(); ++l) {
    for (int s = 0; s < m.num_stages(); ++s) {
      const TransferStats& t = m.transfer(d, l, s);
      *bytes += t.bytes;
      *messages += t.messages;
    }
  }
}

// Adds what one rank's Metrics gained since the last call to the live counters.
class LivePublisher {
 public:
  LivePublisher(const Metrics& metrics, ServeLiveMetrics* live) : metrics_(metrics), live_(live) {}
  void attention(int64_t steps) {
    if (!live_) return;
    int64_t bytes = 0, messages = 0;
    transfer_totals(metrics_, Direction::kFfnToAttn, &bytes, &messages);
    const int64_t prefill = metrics_.prefill_step_latency().count(), decode = metrics_.decode_step_latency().count();
    live_->ffn_to_attention_bytes += bytes - bytes_;
    live_->ffn_to_attention_messages += messages - messages_;
    live_->attention_wait_ns += metrics_.idle_ns() - wait_ns_;
    live_->prefill_steps += prefill - prefill_;
    live_->decode_steps += decode - decode_;
    live_->empty_steps += (steps - prefill - decode) - empty_;
    bytes_ = bytes, messages_ = messages, wait_ns_ = metrics_.idle_ns(), prefill_ = prefill, decode_ = decode;
    empty_ = steps - prefill - decode;
  }
  void ffn(int64_t busy_ns) {
    if (!live_) return;
    int64_t bytes = 0, messages = 0;
    transfer_totals(metrics_, Direction::kAttnToFfn, &bytes, &messages);
    live_->attention_to_ffn_bytes += bytes - bytes_;
    live_->attention_to_ffn_messages += messages - messages_;
    live_->ffn_busy_ns += busy_ns;
    ++live_->ffn_items;
    bytes_ = bytes, messages_ = messages;
    const std::vector<int64_t>& rows = metrics_.expert_rows();
    const size_t n = std::min(rows.size(), static_cast<size_t>(live_->num_experts));
    if (expert_rows_.size() < n) expert_rows_.resize(n, 0);
    for (size_t e = 0; e < n; ++e) {
      if (rows[e] != expert_rows_[e]) live_->expert_rows[e] += rows[e] - expert_rows_[e];
      expert_rows_[e] = rows[e];
    }
  }

 private:
  const Metrics& metrics_;
  ServeLiveMetrics* live_;
  int64_t bytes_ = 0, messages_ = 0, wait_ns_ = 0, prefill_ = 0, decode_ = 0, empty_ = 0;
  std::vector<int64_t> expert_rows_;  // the rank's expert_rows() at the last call
};

// Attention rank a >= 1 of a relayed job: runs what attention rank 0 forwards on its engine and reports
// every token and ended request back (after each step, or when a request ended without one), idling
// through `idle` as any serving rank. Its first message says its engine is up.
Status serve_relayed_rank(RelayLink& link, engine::Engine& eng, runtime::KvPagePool& pool, AttentionIdle& idle) {
  RelayUp up;
  eng.set_listener({.on_token =
                        [&up](int64_t id, int32_t token, const engine::TokenLogprobs* lp) {
                          up.tokens.push_back({.id = id,
                                               .token = token,
                                               .has_logprobs = lp != nullptr,
                                               .logprobs = lp ? *lp : engine::TokenLogprobs{}});
                        },
                    .on_finish =
                        [&up](engine::RequestResult&& r) {
                          up.finishes.push_back({.id = r.id, .reason = r.reason, .message = std::move(r.message)});
                        }});
  auto report = [&]() -> Status {
    up.running = eng.num_running();
    up.kv_pages_used = pool.used_pages();
    up.counters = engine_counters(eng.metrics());
    GB_RETURN_IF_ERROR(link.send(up));
    up.tokens.clear();
    up.finishes.clear();
    return ok_status();
  };
  GB_RETURN_IF_ERROR(report());
  Status wait_error;
  const auto wait = [&link, &wait_error](std::chrono::milliseconds timeout, bool others) {
    Result<WorkWait> w = link.wait(timeout, others);
    if (w.ok()) return *w;
    wait_error = w.status();
    return WorkWait::kMine;  // back to the loop, which returns the error
  };
  bool stopping = false;
  for (;;) {
    GB_RETURN_IF_ERROR(wait_error);
    RelayDown down;
    GB_RETURN_IF_ERROR(link.take(&down));
    stopping = stopping || down.stopping;
    for (engine::Request& r : down.submit) {
      const int64_t id = r.id;
      if (Status s = eng.submit(std::move(r)); !s.ok()) {
        up.finishes.push_back({.id = id, .reason = engine::FinishReason::kError, .message = s.message()});
      }
    }
    for (int64_t id : down.cancel) eng.cancel(id);
    if (eng.has_work()) {
      GB_RETURN_IF_ERROR(eng.step());
      GB_RETURN_IF_ERROR(report());
      continue;
    }
    if (up.has_events()) GB_RETURN_IF_ERROR(report());
    GB_ASSIGN_OR_RETURN(const bool stop, idle.idle(stopping, wait));
    if (stop) break;
  }
  return link.flush();
}

RelayOptions relay_options(const Connector& conn, const AfdConfig& cfg) {
  return RelayOptions{.attention_world = conn.topology().attention_world,
                      .rank_names = conn.topology().rank_names(),
                      .attention_rank = conn.rank(),
                      .timeout_ms = cfg.timeout_ms,
                      .init_timeout_ms = cfg.init_timeout_ms};
}

// The serving driver of an attention rank: publishes the live counters after every step and runs `serve`
// over the rank's engine (or, on a relayed rank, what attention rank 0 forwards), idling through an
// AttentionIdle.
AttentionDriver serve_driver(const AfdConfig& cfg, bool relayed, ServeLiveMetrics* live,
                             const AttentionServeFn& serve) {
  return [&cfg, relayed, live, &serve](Connector& conn, Metrics& metrics, AttentionEngine& e) -> Status {
    // Shared with the executor's hook, which outlives this call.
    auto publisher = std::make_shared<LivePublisher>(metrics, live);
    AfdExecutor& executor = e.executor;
    executor.set_after_forward([publisher, &executor] { publisher->attention(executor.steps()); });
    AttentionIdle idle(executor, keep_alive_ms(cfg), [&] { publisher->attention(executor.steps()); });
    Status s;
    if (!relayed) {
      s = serve(e.attention_rank, e.engine, e.pool, idle, nullptr);
    } else if (e.attention_rank == 0) {
      if (!serve) {
        return invalid_argument(fmt::format(
            "afd: {} has no server to run: under mpirun world rank 0 serves HTTP, so it must be attention rank 0 "
            "(start the attention ranks first)",
            conn.topology().rank_name(conn.world_rank())));
      }
      GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayHub> hub, make_relay_hub(conn.transport(), relay_options(conn, cfg)));
      GB_RETURN_IF_ERROR(hub->wait_ready());
      s = serve(0, e.engine, e.pool, idle, hub.get());
      if (s.ok()) s = hub->flush();
    } else {
      GB_ASSIGN_OR_RETURN(std::unique_ptr<RelayLink> link, make_relay_link(conn.transport(), relay_options(conn, cfg)));
      s = serve_relayed_rank(*link, e.engine, e.pool, idle);
    }
    publisher->attention(executor.steps());
    GB_RETURN_IF_ERROR(s);
    return executor.finish();
  };
}

// The serving side of an FFN rank: the live counters after every work item.
FfnDriver serve_ffn_driver(ServeLiveMetrics* live) {
  FfnDriver d;
  d.wrap = [live](Connector&, Metrics& metrics, ExpertComputeFn inner) -> ExpertComputeFn {
    auto publisher = std::make_shared<LivePublisher>(metrics, live);
    return [inner = std::move(inner), publisher](const FfnWorkItem& item) -> Status {
      const int64_t t0 = now_ns();
      GB_RETURN_IF_ERROR(inner(item));
      publisher->ffn(now_ns() - t0);
      return ok_status();
    };
  };
  return d;
}

Status run_serve_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev, int64_t pool_pages,
                     const ServeJobOptions& options, TransportKind transport, int declared_role,
                     const AttentionServeFn& serve) {
  RankJob job{.checkpoint = &checkpoint,
              .dev = &dev,
              .pool_pages = pool_pages,
              .engine = options.engine,
              .expert_load = options.expert_load,
              .quantized = options.quantized,
              .quantize_own_share = true,
              .ffn_hook = options.ffn_hook};
  if (options.on_weight_lines) {
    job.on_weight_lines = [&options](std::vector<std::string> lines) { options.on_weight_lines(lines); };
  }
  GB_ASSIGN_OR_RETURN(const ValidAfdConfig cfg, prepare_rank_job(options.afd, transport, {}, &job));
  if (options.live && options.live->num_experts == 0) options.live->init_experts(cfg->num_experts);
  const bool relayed = cfg->num_attention > 1 && (transport == TransportKind::kMpi || options.relay_in_process);
  const AttentionDriver attention = serve_driver(cfg, relayed, options.live, serve);
  const FfnDriver ffn = serve_ffn_driver(options.live);
  JobOptions jo;
  jo.fingerprint = job_fingerprint(job, options.fingerprint, nullptr);
  const RankFns fns = job_rank_fns(job, cfg, attention, ffn);
  return transport == TransportKind::kMpi ? run_mpi_rank(cfg, declared_role, fns, jo) : run_inproc_job(cfg, fns, jo);
}

}  // namespace

Status run_inproc_serve_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                            int64_t pool_pages_per_rank, const ServeJobOptions& options,
                            const AttentionServeFn& serve) {
  return run_serve_job(checkpoint, dev, pool_pages_per_rank, options, TransportKind::kInproc, kRoleUndeclared, serve);
}

Status run_mpi_serve_rank(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                          int64_t pool_pages_per_rank, const ServeJobOptions& options, int declared_role,
                          const AttentionServeFn& serve) {
  return run_serve_job(checkpoint, dev, pool_pages_per_rank, options, TransportKind::kMpi, declared_role, serve);
}

}  // namespace genbridge::afd
