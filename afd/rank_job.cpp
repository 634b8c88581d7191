#include "afd/rank_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>
#include <nlohmann/json.hpp>

#include "afd/engine_ffn.h"
#include "afd/wire.h"
#include "runtime/checkpoint/config.h"
#include "runtime/device/moe_dispatch.h"
#include "runtime/engine/assembly.h"
#include "runtime/forward/runner.h"

namespace genbridge::afd {

Result<ValidAfdConfig> fill_model_shape(const model::ModelConfig& c, int64_t max_tokens_per_stage, AfdConfig afd,
                                        const ExpertLoad* load) {
  if (c.num_experts < 1) {
    return invalid_argument("afd: the model has no experts; attention-FFN disaggregation needs a MoE model");
  }
  afd.num_experts = static_cast<int>(c.num_experts);
  afd.top_k = static_cast<int>(c.num_experts_per_tok);
  afd.hidden_size = static_cast<int>(c.hidden_size);
  afd.num_layers = static_cast<int>(c.num_hidden_layers);
  afd.dense_layers.clear();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) afd.dense_layers.push_back(static_cast<int>(l));
  }
  afd.max_tokens_per_stage = static_cast<int>(max_tokens_per_stage);
  if (afd.redundant_experts > 0) {
    if (load == nullptr) {
      return invalid_argument(fmt::format(
          "afd: {} redundant experts need a measured expert load to place them (--afd-expert-load FILE, written by "
          "genbridge run --afd ... --afd-expert-load-out FILE)",
          afd.redundant_experts));
    }
    GB_ASSIGN_OR_RETURN(afd.replicas, plan_replicas(afd, *load));
  }
  return ValidAfdConfig::create(std::move(afd));
}

Result<ValidAfdConfig> prepare_rank_job(AfdConfig settings, TransportKind transport,
                                        const std::vector<engine::Request>& requests, RankJob* job) {
  if (job->warmup_steps < 0) {
    return invalid_argument(fmt::format("afd: warm-up steps is {} but must be >= 0", job->warmup_steps));
  }
  settings.transport = transport;
  // A quantized dispatch sends the DeviceOperator's rows of codes and scales instead of bf16 rows.
  const runtime::DispatchRepresentation* dispatch = job->dev->moe_dispatch();
  settings.dispatch_row_bytes =
      dispatch ? static_cast<int>(runtime::dispatch_row_bytes(*dispatch, job->checkpoint->config().hidden_size)) : 0;
  engine::EngineOptions& e = job->engine;
  e.max_batch = std::max<int64_t>(1, e.max_batch);  // as the engine takes it
  int64_t longest = 1;
  for (const auto& r : requests) longest = std::max<int64_t>(longest, static_cast<int64_t>(r.prompt.size()));
  e.max_prefill_tokens = std::max(e.max_prefill_tokens, longest);
  return fill_model_shape(job->checkpoint->config(), std::max(e.max_prefill_tokens, e.max_batch), std::move(settings),
                          job->expert_load ? &*job->expert_load : nullptr);
}

std::vector<FingerprintItem> job_fingerprint(const RankJob& job, std::vector<FingerprintItem> items,
                                             const std::vector<engine::Request>* requests) {
  const model::Checkpoint& checkpoint = *job.checkpoint;
  const runtime::DeviceOperator& dev = *job.dev;
  if (requests == nullptr) items.push_back({"job", "serve"});
  const nlohmann::json config = nlohmann::json::parse(model::to_config_json(checkpoint.config()));
  for (auto it = config.begin(); it != config.end(); ++it) {
    items.push_back({fmt::format("model config '{}'", it.key()), it.value().dump()});
  }
  items.push_back({"model weights (bytes mapped)", std::to_string(checkpoint.mapped_weight_bytes())});
  if (requests != nullptr) {
    items.push_back({"number of requests", std::to_string(requests->size())});
    std::string bytes;
    auto put = [&](const auto& v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    for (const engine::Request& r : *requests) {
      put(r.id);
      put(r.prompt.size());
      for (int32_t t : r.prompt) put(t);
      put(r.max_new_tokens);
      put(r.stop_tokens.size());
      for (int32_t t : r.stop_tokens) put(t);
      put(r.sampling.temperature);
      put(r.sampling.top_k);
      put(r.sampling.top_p);
      put(r.sampling.seed);
    }
    items.push_back({"requests (prompts, max_new_tokens, stop tokens, sampling)", fingerprint_digest(bytes)});
    items.push_back({"warm-up steps", std::to_string(job.warmup_steps)});
  }
  items.push_back({"engine max_batch", std::to_string(job.engine.max_batch)});
  items.push_back({"engine max_prefill_tokens", std::to_string(job.engine.max_prefill_tokens)});
  items.push_back({"engine max_num_batched_tokens", std::to_string(job.engine.max_num_batched_tokens)});
  items.push_back({"engine preemption", engine::preemption_name(job.engine.preemption)});
  items.push_back({"engine prefix_caching", job.engine.prefix_caching ? "true" : "false"});
  if (requests != nullptr) {
    items.push_back({"engine record_logits", job.engine.record_logits ? "true" : "false"});
    items.push_back({"engine record_choices", job.engine.record_choices ? "true" : "false"});
  }
  items.push_back({"KV pages per attention rank", std::to_string(job.pool_pages)});
  items.push_back({"KV cache format", std::string(ops::kv_cache_format_name(dev.kv_format()))});
  items.push_back({"weight quantization",
                   std::string(ops::weight_quant_scheme_name(dev.weight_quant() ? dev.weight_quant()->scheme
                                                                                : ops::WeightQuantScheme::kNone))});
  items.push_back({"MoE dispatch", dev.moe_dispatch() ? "quantized" : "bf16"});
  return items;
}

Result<std::unique_ptr<model::QuantizedWeights>> quantize_rank_share(Connector& conn,
                                                                     const model::Checkpoint& checkpoint,
                                                                     const runtime::DeviceOperator& dev,
                                                                     const AfdConfig& cfg,
                                                                     std::vector<std::string>* lines) {
  model::QuantizeOptions share;
  share.mxfp4_repr = dev.mxfp4_weight_quant();
  if (conn.role() == Role::kAttention) {
    share.experts = false;
  } else {
    share.attention = false;
    // Its own experts and its copies of others (redundant experts): one range holding all of them.
    std::tie(share.expert_begin, share.expert_end) = conn.topology().held_range(-1, conn.rank());
  }
  Result<std::unique_ptr<model::QuantizedWeights>> q =
      model::QuantizedWeights::quantize(checkpoint, *dev.weight_quant(), dev.contract().weight_quant.layers, share);
  // A failed rank still meets the others: its line carries the error and world rank 0 ends the job with it.
  const std::string me = conn.topology().rank_name(conn.world_rank());
  const std::string line = q.ok() ? fmt::format("{}: {}", me, (*q)->describe())
                                  : fmt::format("!{} failed quantizing its weights: {}", me, q.status().to_string());
  GB_ASSIGN_OR_RETURN(std::vector<std::string> all, conn.gather(line, cfg.init_timeout_ms));
  Transport& t = conn.transport();
  const Deadline deadline = deadline_after_ms(cfg.init_timeout_ms);
  Completion c;
  int32_t failed = 0;
  if (conn.world_rank() == 0) {
    for (const std::string& l : all) {
      if (!l.empty() && l[0] == '!') return internal_error(l.substr(1));  // ends the job (MPI_Abort)
    }
    std::vector<RequestId> ids;
    for (int r = 1; r < t.world_size(); ++r) {
      const ConstSegment seg{&failed, sizeof(failed)};
      GB_ASSIGN_OR_RETURN(RequestId id, t.isend(r, Channel::kControl, wire::kTagLoadRelease, {&seg, 1}));
      ids.push_back(id);
    }
    for (RequestId& id : ids) GB_RETURN_IF_ERROR(t.wait_any({&id, 1}, deadline, &c).status());
    *lines = std::move(all);
  } else {
    const MutSegment seg{&failed, sizeof(failed)};
    GB_ASSIGN_OR_RETURN(RequestId id, t.irecv(0, Channel::kControl, wire::kTagLoadRelease, {&seg, 1}));
    Result<int> w = t.wait_any({&id, 1}, deadline, &c);
    if (!w.ok()) {
      return Status(w.status().code(),
                    fmt::format("afd: {} waiting for every rank to load its weights: {}", me, w.status().message()));
    }
  }
  return q;
}

StepAgreementOptions attention_agreement(const Connector& conn, int id, int64_t timeout_ms, std::string purpose) {
  return StepAgreementOptions{.attention_world = conn.topology().attention_world,
                              .rank_names = conn.topology().rank_names(),
                              .attention_rank = conn.rank(),
                              .timeout_ms = timeout_ms,
                              .id = id,
                              .purpose = std::move(purpose)};
}

Status with_attention_engine(const RankJob& job, const AfdConfig& cfg, Connector& conn, Metrics& metrics,
                             StepAgreement* lockstep, const model::QuantizedWeights* quantized,
                             const std::function<Status(AttentionEngine& engine)>& drive) {
  AttentionRunner attention(conn, &metrics);
  const int a = conn.rank();
  AfdExecutor* executor = nullptr;  // owned by the assembly
  const engine::ExecutorFactory make_executor =
      [&](const model::ModelRunner& runner) -> Result<std::unique_ptr<engine::ForwardExecutor>> {
    auto e = std::make_unique<AfdExecutor>(runner, attention, cfg.num_stages, lockstep, job.warmup_steps);
    if (job.attention_hook) {
      e->set_before_step([hook = job.attention_hook, a](int64_t step) { return hook(a, step); });
    }
    executor = e.get();
    return std::unique_ptr<engine::ForwardExecutor>(std::move(e));
  };
  GB_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::AssembledEngine> assembled,
      engine::assemble_engine(
          *job.checkpoint, *job.dev, job.pool_pages,
          // One state slot per sequence the engine runs at once, as
          // the monolithic assembly (kv_pool_options) gives it.
          {.engine = job.engine, .kv_pool = {.state_slots = job.engine.max_batch}, .quantized = quantized},
          make_executor));
  AttentionEngine e{.attention_rank = a, .engine = *assembled->engine, .pool = assembled->pool, .executor = *executor};
  return drive(e);
}

namespace {

// This rank's weights: the caller's, or (quantize_own_share) the share this rank quantizes itself.
Result<const model::QuantizedWeights*> rank_weights(const RankJob& job, const AfdConfig& cfg, Connector& conn,
                                                    std::unique_ptr<model::QuantizedWeights>* share) {
  const bool rank_share =
      engine::weight_quant_timing(*job.dev, job.quantize_own_share) == engine::WeightQuantTiming::kRankShare;
  if (!rank_share || job.quantized) return job.quantized;
  std::vector<std::string> lines;
  GB_ASSIGN_OR_RETURN(*share, quantize_rank_share(conn, *job.checkpoint, *job.dev, cfg, &lines));
  if (conn.world_rank() == 0 && job.on_weight_lines) job.on_weight_lines(std::move(lines));
  return share->get();
}

Status attention_rank(const RankJob& job, const ValidAfdConfig& cfg, const AttentionDriver& driver, Connector& conn,
                      Metrics& metrics) {
  std::unique_ptr<model::QuantizedWeights> share;
  GB_ASSIGN_OR_RETURN(const model::QuantizedWeights* quantized, rank_weights(job, cfg, conn, &share));
  std::unique_ptr<StepAgreement> lockstep;
  if (!cfg->async_dp && cfg->num_attention > 1) {
    GB_ASSIGN_OR_RETURN(lockstep, make_step_agreement(conn.transport(), attention_agreement(conn, 0, cfg->timeout_ms,
                                                                                            "agree on the next step")));
  }
  return with_attention_engine(job, cfg, conn, metrics, lockstep.get(), quantized,
                               [&](AttentionEngine& e) { return driver(conn, metrics, e); });
}

Status ffn_rank(const RankJob& job, const ValidAfdConfig& cfg, const FfnDriver& driver, Connector& conn,
                Metrics& metrics) {
  const model::ModelConfig& c = job.checkpoint->config();
  std::unique_ptr<model::QuantizedWeights> share;
  GB_ASSIGN_OR_RETURN(const model::QuantizedWeights* quantized, rank_weights(job, cfg, conn, &share));
  const model::ExpertBank experts(*job.checkpoint, quantized);
  ExpertComputeFn compute = make_expert_compute(experts, c.num_experts_per_tok, c.hidden_size, job.dev->moe_dispatch());
  if (driver.wrap) compute = driver.wrap(conn, metrics, std::move(compute));
  if (job.ffn_hook) {  // outside the driver's wrap: what the driver measures is the experts' own work
    compute = [hook = job.ffn_hook, inner = std::move(compute), f = conn.rank()](const FfnWorkItem& item) -> Status {
      GB_RETURN_IF_ERROR(hook(f, item));
      return inner(item);
    };
  }
  FfnRunner runner(conn, std::move(compute), &metrics);
  GB_RETURN_IF_ERROR(runner.run());
  return driver.after ? driver.after(conn) : ok_status();
}

}  // namespace

RankFns job_rank_fns(const RankJob& job, const ValidAfdConfig& cfg, const AttentionDriver& attention,
                     const FfnDriver& ffn) {
  RankFns fns;
  fns.attention = [&job, &cfg, &attention](Connector& conn, Metrics& metrics) {
    return attention_rank(job, cfg, attention, conn, metrics);
  };
  fns.ffn = [&job, &cfg, &ffn](Connector& conn, Metrics& metrics) { return ffn_rank(job, cfg, ffn, conn, metrics); };
  return fns;
}

}  // namespace genbridge::afd
