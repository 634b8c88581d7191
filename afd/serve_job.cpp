#include "afd/serve_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>

#include "afd/engine_ffn.h"
#include "afd/engine_job.h"
#include "afd/job.h"
#include "afd/runner.h"
#include "afd/transports/step_agreement.h"
#include "runtime/checkpoint/config.h"
#include "runtime/forward/runner.h"

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
  // back to the loop, whose engine step agrees with the others (AfdExecutor::forward).
  if (!others_active_ && !want_stop && wait(std::chrono::milliseconds(keep_alive_ms_), true) == WorkWait::kMine) {
    return false;
  }
  GB_ASSIGN_OR_RETURN(const bool any_work, agreement->any_active(false));
  if (any_work) {
    others_active_ = true;
    GB_RETURN_IF_ERROR(empty_step());  // beside the others' step
    return false;
  }
  others_active_ = false;
  GB_ASSIGN_OR_RETURN(const bool go_on, agreement->any_active(!want_stop));
  if (!go_on) return true;
  GB_RETURN_IF_ERROR(empty_step());  // every rank: the keep-alive
  ++keep_alive_steps_;
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
  }

 private:
  const Metrics& metrics_;
  ServeLiveMetrics* live_;
  int64_t bytes_ = 0, messages_ = 0, wait_ns_ = 0, prefill_ = 0, decode_ = 0, empty_ = 0;
};

// The engine's executor on a serving attention rank: the AFD executor, publishing the live counters after
// every step.
class PublishingExecutor final : public engine::ForwardExecutor {
 public:
  PublishingExecutor(AfdExecutor& inner, LivePublisher& publisher) : inner_(inner), publisher_(publisher) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  Status forward(const model::ForwardInput& input, std::span<float> logits) override {
    const Status s = inner_.forward(input, logits);
    publisher_.attention(inner_.steps());
    return s;
  }
  std::span<const model::ActivationFault> faults() const override { return inner_.faults(); }
  void set_choice_sink(const model::ChoiceSink* sink) override { inner_.set_choice_sink(sink); }

 private:
  AfdExecutor& inner_;
  LivePublisher& publisher_;
};

struct PreparedJob {
  AfdConfig cfg;
  std::vector<FingerprintItem> fingerprint;
};

Result<PreparedJob> prepare(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev, int64_t pool_pages,
                            const ServeJobOptions& options, TransportKind transport) {
  const model::ModelConfig& c = checkpoint.config();
  PreparedJob job;
  job.cfg = options.afd;
  job.cfg.transport = transport;
  const int64_t max_batch = std::max<int64_t>(1, options.engine.max_batch);
  GB_RETURN_IF_ERROR(fill_model_shape(c, std::max(max_prompt_tokens(options), max_batch), &job.cfg));
  // What every rank must agree on: the tool's items, then what the job knows itself.
  job.fingerprint = options.fingerprint;
  job.fingerprint.push_back({"job", "serve"});
  const nlohmann::json config = nlohmann::json::parse(model::to_config_json(c));
  for (auto it = config.begin(); it != config.end(); ++it) {
    job.fingerprint.push_back({fmt::format("model config '{}'", it.key()), it.value().dump()});
  }
  job.fingerprint.push_back({"model weights (bytes mapped)", std::to_string(checkpoint.mapped_weight_bytes())});
  job.fingerprint.push_back({"engine max_batch", std::to_string(max_batch)});
  job.fingerprint.push_back({"engine max_prefill_tokens", std::to_string(max_prompt_tokens(options))});
  job.fingerprint.push_back({"KV pages per attention rank", std::to_string(pool_pages)});
  job.fingerprint.push_back({"KV cache format", std::string(ops::kv_cache_format_name(dev.kv_format()))});
  job.fingerprint.push_back(
      {"weight quantization", std::string(ops::weight_quant_scheme_name(
                                  dev.weight_quant() ? dev.weight_quant()->scheme : ops::WeightQuantScheme::kNone))});
  return job;
}

Status serve_attention_rank(Connector& conn, Metrics& metrics, const model::Checkpoint& checkpoint,
                            const runtime::DeviceOperator& dev, int64_t pool_pages, const AfdConfig& cfg,
                            const ServeJobOptions& options, const AttentionServeFn& serve) {
  const model::ModelConfig& c = checkpoint.config();
  const int a = conn.rank();
  std::unique_ptr<StepAgreement> lockstep;
  if (!cfg.async_dp && cfg.num_attention > 1) {
    GB_ASSIGN_OR_RETURN(
        lockstep,
        make_step_agreement(conn.transport(), StepAgreementOptions{.attention_world = conn.topology().attention_world,
                                                                   .rank_names = conn.topology().rank_names(),
                                                                   .attention_rank = a,
                                                                   .timeout_ms = cfg.timeout_ms,
                                                                   .id = 0,
                                                                   .purpose = "agree on the next step"}));
  }
  GB_ASSIGN_OR_RETURN(runtime::KvPagePool pool,
                      runtime::KvPagePool::create(dev.kv_page_geometry(model::kv_model_shape(c)), pool_pages));
  GB_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> runner,
                      model::ModelRunner::create(checkpoint, dev, pool, options.quantized));
  AttentionRunner attention(conn, &metrics);
  AfdExecutor executor(*runner, attention, cfg.num_stages, lockstep.get(), /*warmup_steps=*/0);
  LivePublisher publisher(metrics, options.live);
  PublishingExecutor published(executor, publisher);
  engine::EngineOptions eopt = options.engine;
  eopt.max_prefill_tokens = max_prompt_tokens(options);
  engine::Engine eng(published, pool, eopt);
  AttentionIdle idle(executor, keep_alive_ms(cfg), [&] { publisher.attention(executor.steps()); });
  Status s = serve(a, eng, pool, idle);
  publisher.attention(executor.steps());
  GB_RETURN_IF_ERROR(s);
  GB_RETURN_IF_ERROR(executor.finish());
  return ok_status();
}

RankFns serve_rank_fns(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev, int64_t pool_pages,
                       const AfdConfig& cfg, const ServeJobOptions& options, const AttentionServeFn& serve) {
  RankFns fns;
  // Under mpirun with --weight-quant and no weights from the caller: each rank quantizes only its share first
  // (every rank of the job calls quantize_rank_share; world rank 0 gets every rank's line).
  auto with_share = [&checkpoint, &dev, &cfg, &options](Connector& conn,
                                                        std::unique_ptr<model::QuantizedWeights>* share) -> Status {
    if (options.quantized || !dev.weight_quant()) return ok_status();
    std::vector<std::string> lines;
    GB_ASSIGN_OR_RETURN(*share, quantize_rank_share(conn, checkpoint, dev, cfg, &lines));
    if (conn.world_rank() == 0 && options.on_weight_lines) options.on_weight_lines(lines);
    return ok_status();
  };
  fns.attention = [&checkpoint, &dev, pool_pages, &cfg, &options, &serve, with_share](Connector& conn,
                                                                                      Metrics& metrics) -> Status {
    std::unique_ptr<model::QuantizedWeights> share;
    GB_RETURN_IF_ERROR(with_share(conn, &share));
    if (!share) return serve_attention_rank(conn, metrics, checkpoint, dev, pool_pages, cfg, options, serve);
    ServeJobOptions mine = options;
    mine.quantized = share.get();
    return serve_attention_rank(conn, metrics, checkpoint, dev, pool_pages, cfg, mine, serve);
  };
  fns.ffn = [&checkpoint, &options, with_share](Connector& conn, Metrics& metrics) -> Status {
    const model::ModelConfig& c = checkpoint.config();
    std::unique_ptr<model::QuantizedWeights> share;
    GB_RETURN_IF_ERROR(with_share(conn, &share));
    const model::ExpertBank experts(checkpoint, share ? share.get() : options.quantized);
    ExpertComputeFn inner = make_expert_compute(experts, c.num_experts_per_tok, c.hidden_size);
    auto publisher = std::make_shared<LivePublisher>(metrics, options.live);
    const int f = conn.rank();
    ExpertComputeFn compute = [&options, inner = std::move(inner), publisher, f](const FfnWorkItem& item) -> Status {
      if (options.ffn_hook) GB_RETURN_IF_ERROR(options.ffn_hook(f, item));
      const int64_t t0 = now_ns();
      GB_RETURN_IF_ERROR(inner(item));
      publisher->ffn(now_ns() - t0);
      return ok_status();
    };
    FfnRunner runner(conn, std::move(compute), &metrics);
    return runner.run();
  };
  return fns;
}

}  // namespace

Status run_inproc_serve_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                            int64_t pool_pages_per_rank, const ServeJobOptions& options,
                            const AttentionServeFn& serve) {
  GB_ASSIGN_OR_RETURN(const PreparedJob job,
                      prepare(checkpoint, dev, pool_pages_per_rank, options, TransportKind::kInproc));
  JobOptions jo;
  jo.fingerprint = job.fingerprint;
  return run_inproc_job(job.cfg, serve_rank_fns(checkpoint, dev, pool_pages_per_rank, job.cfg, options, serve), jo);
}

Status run_mpi_serve_rank(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                          int64_t pool_pages_per_rank, const ServeJobOptions& options, int declared_role,
                          const AttentionServeFn& serve) {
  GB_ASSIGN_OR_RETURN(const PreparedJob job,
                      prepare(checkpoint, dev, pool_pages_per_rank, options, TransportKind::kMpi));
  JobOptions jo;
  jo.fingerprint = job.fingerprint;
  return run_mpi_rank(job.cfg, declared_role,
                      serve_rank_fns(checkpoint, dev, pool_pages_per_rank, job.cfg, options, serve), jo);
}

}  // namespace genbridge::afd
