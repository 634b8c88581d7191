#include "afd/engine_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <type_traits>

#include "afd/job.h"
#include "afd/transports/step_agreement.h"
#include "afd/wire.h"
#include "runtime/checkpoint/config.h"
#include "runtime/forward/deepseek_attention.h"
#include "runtime/forward/quant_weights.h"

namespace genbridge::afd {

Status fill_model_shape(const model::ModelConfig& c, int64_t max_tokens_per_stage, AfdConfig* afd) {
  if (c.num_experts < 1) {
    return invalid_argument("afd: the model has no experts; attention-FFN disaggregation needs a MoE model");
  }
  afd->num_experts = static_cast<int>(c.num_experts);
  afd->top_k = static_cast<int>(c.num_experts_per_tok);
  afd->hidden_size = static_cast<int>(c.hidden_size);
  afd->num_layers = static_cast<int>(c.num_hidden_layers);
  afd->dense_layers.clear();
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.is_moe_layer(l)) afd->dense_layers.push_back(static_cast<int>(l));
  }
  afd->max_tokens_per_stage = static_cast<int>(max_tokens_per_stage);
  return validate(*afd);
}

namespace {

void merge_metrics(const engine::EngineMetrics& m, engine::EngineMetrics& into) {
  into.prefill_tokens += m.prefill_tokens;
  into.decode_tokens += m.decode_tokens;
  into.prefill_seconds = std::max(into.prefill_seconds, m.prefill_seconds);
  into.decode_seconds = std::max(into.decode_seconds, m.decode_seconds);
  into.ttft_seconds.insert(into.ttft_seconds.end(), m.ttft_seconds.begin(), m.ttft_seconds.end());
  into.tpot_seconds.insert(into.tpot_seconds.end(), m.tpot_seconds.begin(), m.tpot_seconds.end());
  into.kv_bytes_per_token = m.kv_bytes_per_token;
  into.requests_finished += m.requests_finished;
  into.requests_refused += m.requests_refused;
  into.requests_failed += m.requests_failed;
}

// The job's config and engine options: model-shape keys from the checkpoint, the prefill budget raised
// to the longest prompt (every rank computes the same values from the same requests).
Status prepare_job(const model::ModelConfig& c, const std::vector<engine::Request>& requests,
                   const EngineJobOptions& options, TransportKind transport, AfdConfig* cfg,
                   engine::EngineOptions* eopt) {
  if (options.warmup_steps < 0) {
    return invalid_argument(fmt::format("afd: warm-up steps is {} but must be >= 0", options.warmup_steps));
  }
  *cfg = options.afd;
  cfg->transport = transport;
  *eopt = options.engine;
  int64_t longest = 1;
  for (const auto& r : requests) longest = std::max<int64_t>(longest, static_cast<int64_t>(r.prompt.size()));
  eopt->max_prefill_tokens = std::max(eopt->max_prefill_tokens, longest);
  return fill_model_shape(c, std::max(eopt->max_prefill_tokens, eopt->max_batch), cfg);
}

// What every rank must agree on: the tool's items first (named as the user typed them), then what the job
// itself knows must agree, so that a mismatch is caught even when the tool passed nothing: every key of the
// model config, the weights' size, the requests (count and a digest of prompts, lengths, stop tokens and
// sampling), the engine options and the KV pool. (Topology, connector and stages are AfdConfig settings,
// compared before.)
std::vector<FingerprintItem> job_fingerprint(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                             const std::vector<engine::Request>& requests, int64_t pool_pages,
                                             const engine::EngineOptions& eopt, const EngineJobOptions& options) {
  std::vector<FingerprintItem> items = options.fingerprint;
  const nlohmann::json config = nlohmann::json::parse(model::to_config_json(checkpoint.config()));
  for (auto it = config.begin(); it != config.end(); ++it) {
    items.push_back({fmt::format("model config '{}'", it.key()), it.value().dump()});
  }
  items.push_back({"model weights (bytes mapped)", std::to_string(checkpoint.mapped_weight_bytes())});
  items.push_back({"number of requests", std::to_string(requests.size())});
  std::string bytes;
  auto put = [&](const auto& v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  for (const engine::Request& r : requests) {
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
  items.push_back({"warm-up steps", std::to_string(options.warmup_steps)});
  items.push_back({"engine max_batch", std::to_string(eopt.max_batch)});
  items.push_back({"engine max_prefill_tokens", std::to_string(eopt.max_prefill_tokens)});
  items.push_back({"engine record_logits", eopt.record_logits ? "true" : "false"});
  items.push_back({"engine record_choices", eopt.record_choices ? "true" : "false"});
  items.push_back({"KV pages per attention rank", std::to_string(pool_pages)});
  items.push_back({"KV cache format", std::string(ops::kv_cache_format_name(dev.kv_format()))});
  items.push_back({"weight quantization",
                   std::string(ops::weight_quant_scheme_name(dev.weight_quant() ? dev.weight_quant()->scheme
                                                                                : ops::WeightQuantScheme::kNone))});
  return items;
}

ExpertComputeFn expert_compute_with_hook(const model::ExpertBank& experts, const model::ModelConfig& c,
                                         const EngineJobOptions& options, int ffn_rank) {
  ExpertComputeFn compute = make_expert_compute(experts, c.num_experts_per_tok, c.hidden_size);
  if (!options.ffn_hook) return compute;
  return [hook = options.ffn_hook, inner = std::move(compute), ffn_rank](const FfnWorkItem& item) -> Status {
    GB_RETURN_IF_ERROR(hook(ffn_rank, item));
    return inner(item);
  };
}

// Byte serialisation of one attention rank's results and metrics for Connector::gather (same process
// image on every rank: native byte order, floats as their bits).
class Writer {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T>
  void put_vec(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  Status get(T* v) {
    if (in_.size() - pos_ < sizeof(T)) return truncated();
    std::memcpy(v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return ok_status();
  }
  template <typename T>
  Status get_vec(std::vector<T>* v) {
    uint64_t n = 0;
    GB_RETURN_IF_ERROR(get(&n));
    if (n > (in_.size() - pos_) / sizeof(T)) return truncated();
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), in_.data() + pos_, n * sizeof(T));  // an empty vector's data() may be null
    pos_ += n * sizeof(T);
    return ok_status();
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  static Status truncated() { return internal_error("afd: a gathered engine result is truncated"); }
  std::string_view in_;
  size_t pos_ = 0;
};

std::string serialize_rank(const std::vector<size_t>& indices, const std::vector<engine::RequestResult>& results,
                           const engine::EngineMetrics& m) {
  Writer w;
  w.put<uint64_t>(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    const engine::RequestResult& r = results[i];
    w.put<uint64_t>(indices[i]);
    w.put<int64_t>(r.id);
    w.put<int32_t>(static_cast<int32_t>(r.reason));
    w.put_vec(r.tokens);
    w.put_vec(std::vector<char>(r.message.begin(), r.message.end()));
    w.put_vec(r.logits);
    w.put_vec(r.choices.records);
    w.put_vec(r.choices.expert_ids);
    w.put_vec(r.choices.expert_weights);
    w.put_vec(r.choices.index_positions);
  }
  w.put(m.prefill_tokens);
  w.put(m.decode_tokens);
  w.put(m.prefill_seconds);
  w.put(m.decode_seconds);
  w.put_vec(m.ttft_seconds);
  w.put_vec(m.tpot_seconds);
  w.put(m.kv_bytes_per_token);
  w.put(m.requests_finished);
  w.put(m.requests_refused);
  w.put(m.requests_failed);
  return w.take();
}

// Stores a rank's results at their request indices and returns its metrics.
Result<engine::EngineMetrics> deserialize_rank(std::string_view blob, std::vector<engine::RequestResult>* results,
                                               std::vector<bool>* filled) {
  Reader rd(blob);
  uint64_t n = 0;
  GB_RETURN_IF_ERROR(rd.get(&n));
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t index = 0;
    GB_RETURN_IF_ERROR(rd.get(&index));
    if (index >= results->size() || (*filled)[index]) {
      return internal_error(fmt::format("afd: a gathered engine result names request {} twice or out of range", index));
    }
    engine::RequestResult& r = (*results)[index];
    int32_t reason = 0;
    std::vector<char> msg;
    GB_RETURN_IF_ERROR(rd.get(&r.id));
    GB_RETURN_IF_ERROR(rd.get(&reason));
    GB_RETURN_IF_ERROR(rd.get_vec(&r.tokens));
    GB_RETURN_IF_ERROR(rd.get_vec(&msg));
    GB_RETURN_IF_ERROR(rd.get_vec(&r.logits));
    GB_RETURN_IF_ERROR(rd.get_vec(&r.choices.records));
    GB_RETURN_IF_ERROR(rd.get_vec(&r.choices.expert_ids));
    GB_RETURN_IF_ERROR(rd.get_vec(&r.choices.expert_weights));
    GB_RETURN_IF_ERROR(rd.get_vec(&r.choices.index_positions));
    r.reason = static_cast<engine::FinishReason>(reason);
    r.message.assign(msg.begin(), msg.end());
    (*filled)[index] = true;
  }
  engine::EngineMetrics m;
  GB_RETURN_IF_ERROR(rd.get(&m.prefill_tokens));
  GB_RETURN_IF_ERROR(rd.get(&m.decode_tokens));
  GB_RETURN_IF_ERROR(rd.get(&m.prefill_seconds));
  GB_RETURN_IF_ERROR(rd.get(&m.decode_seconds));
  GB_RETURN_IF_ERROR(rd.get_vec(&m.ttft_seconds));
  GB_RETURN_IF_ERROR(rd.get_vec(&m.tpot_seconds));
  GB_RETURN_IF_ERROR(rd.get(&m.kv_bytes_per_token));
  GB_RETURN_IF_ERROR(rd.get(&m.requests_finished));
  GB_RETURN_IF_ERROR(rd.get(&m.requests_refused));
  GB_RETURN_IF_ERROR(rd.get(&m.requests_failed));
  if (!rd.done()) return internal_error("afd: a gathered engine result has trailing bytes");
  return m;
}

}  // namespace

// Under mpirun: see engine_job.h.
Result<std::unique_ptr<model::QuantizedWeights>> quantize_rank_share(Connector& conn,
                                                                     const model::Checkpoint& checkpoint,
                                                                     const runtime::DeviceOperator& dev,
                                                                     const AfdConfig& cfg,
                                                                     std::vector<std::string>* lines) {
  model::QuantizeOptions share;
  if (conn.role() == Role::kAttention) {
    share.experts = false;
  } else {
    share.attention = false;
    share.expert_begin = conn.topology().expert_begin(conn.rank());
    share.expert_end = conn.topology().expert_end(conn.rank());
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

namespace {

// One attention rank's engine over its requests (request r goes to attention rank r % A).
struct AttentionRankRun {
  std::vector<size_t> mine;  // request indices, in submission order
  std::vector<engine::RequestResult> results;
  engine::EngineMetrics metrics;
};

Result<AttentionRankRun> run_attention_rank(Connector& conn, Metrics& metrics, const model::Checkpoint& checkpoint,
                                            const runtime::DeviceOperator& dev,
                                            const std::vector<engine::Request>& requests, int64_t pool_pages,
                                            const AfdConfig& cfg, const engine::EngineOptions& eopt,
                                            const EngineJobOptions& options, bool meet_at_end) {
  const model::ModelConfig& c = checkpoint.config();
  const int a = conn.rank(), A = cfg.num_attention;
  auto agreement_options = [&](int id, int64_t timeout_ms, std::string purpose) {
    return StepAgreementOptions{.attention_world = conn.topology().attention_world,
                                .rank_names = conn.topology().rank_names(),
                                .attention_rank = a,
                                .timeout_ms = timeout_ms,
                                .id = id,
                                .purpose = std::move(purpose)};
  };
  std::unique_ptr<StepAgreement> lockstep, all_done;
  if (!cfg.async_dp && A > 1) {
    GB_ASSIGN_OR_RETURN(lockstep, make_step_agreement(conn.transport(),
                                                      agreement_options(0, cfg.timeout_ms, "agree on the next step")));
  }
  if (meet_at_end && A > 1) {
    // Attention ranks that step independently (async_dp) may finish far apart: they meet here before the
    // results are gathered. A rank still decoding may take long (idle_timeout_ms); one that stopped is
    // caught sooner by the FFN ranks, which it owes its next step within timeout_ms.
    GB_ASSIGN_OR_RETURN(
        all_done, make_step_agreement(conn.transport(), agreement_options(1, cfg.idle_timeout_ms, "finish decoding")));
  }
  const runtime::KvPageGeometry geometry = dev.kv_page_geometry(model::kv_model_shape(c));
  GB_ASSIGN_OR_RETURN(runtime::KvPagePool pool, runtime::KvPagePool::create(geometry, pool_pages));
  GB_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> runner,
                      model::ModelRunner::create(checkpoint, dev, pool, options.quantized));
  AttentionRunner attention(conn, &metrics);
  AfdExecutor executor(*runner, attention, cfg.num_stages, lockstep.get(), options.warmup_steps);
  if (options.attention_hook) {
    executor.set_before_step([&options, a](int64_t step) { return options.attention_hook(a, step); });
  }
  engine::Engine eng(executor, pool, eopt);
  AttentionRankRun out;
  for (size_t r = static_cast<size_t>(a); r < requests.size(); r += static_cast<size_t>(A)) {
    out.mine.push_back(r);
    GB_RETURN_IF_ERROR(eng.submit(requests[r]));
  }
  GB_RETURN_IF_ERROR(eng.run_to_completion());
  GB_RETURN_IF_ERROR(executor.finish());
  if (all_done) GB_RETURN_IF_ERROR(all_done->any_active(false).status());
  out.results = eng.results();
  out.metrics = eng.metrics();
  return out;
}

}  // namespace

Result<EngineJobResult> run_inproc_engine_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                              std::vector<engine::Request> requests, int64_t pool_pages_per_rank,
                                              const EngineJobOptions& options) {
  const model::ModelConfig& c = checkpoint.config();
  AfdConfig cfg;
  engine::EngineOptions eopt;
  GB_RETURN_IF_ERROR(prepare_job(c, requests, options, TransportKind::kInproc, &cfg, &eopt));
  const int A = cfg.num_attention;
  std::vector<engine::RequestResult> results(requests.size());
  std::vector<engine::EngineMetrics> rank_metrics(static_cast<size_t>(A));
  const model::ExpertBank experts(checkpoint, options.quantized);

  RankFns fns;
  fns.attention = [&](Connector& conn, Metrics& metrics) -> Status {
    GB_ASSIGN_OR_RETURN(AttentionRankRun run, run_attention_rank(conn, metrics, checkpoint, dev, requests,
                                                                 pool_pages_per_rank, cfg, eopt, options, false));
    for (size_t i = 0; i < run.mine.size(); ++i) results[run.mine[i]] = std::move(run.results[i]);
    rank_metrics[conn.rank()] = std::move(run.metrics);
    return ok_status();
  };
  fns.ffn = [&](Connector& conn, Metrics& metrics) -> Status {
    FfnRunner runner(conn, expert_compute_with_hook(experts, c, options, conn.rank()), &metrics);
    return runner.run();
  };

  EngineJobResult out;
  JobOptions jo;
  jo.trace_path = options.trace_path;
  jo.trace_events = options.trace_path.empty() ? 0 : (size_t{1} << 18);
  jo.report = &out.report;
  jo.fingerprint = job_fingerprint(checkpoint, dev, requests, pool_pages_per_rank, eopt, options);
  GB_RETURN_IF_ERROR(run_inproc_job(cfg, fns, jo));
  out.results = std::move(results);
  for (const auto& m : rank_metrics) merge_metrics(m, out.metrics);
  out.num_ranks = cfg.num_attention + cfg.num_ffn;
  return out;
}

Result<EngineJobResult> run_mpi_engine_rank(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                            std::vector<engine::Request> requests, int64_t pool_pages_per_rank,
                                            const EngineJobOptions& options, int declared_role) {
  const model::ModelConfig& c = checkpoint.config();
  AfdConfig cfg;
  engine::EngineOptions eopt;
  GB_RETURN_IF_ERROR(prepare_job(c, requests, options, TransportKind::kMpi, &cfg, &eopt));
  const size_t num_requests = requests.size();

  EngineJobResult out;
  bool root = false;
  // Every rank gathers once, after its role's work: attention ranks their results, FFN ranks nothing.
  // Every rank is due at once (the attention ranks met in all_done; the FFN ranks end when they all
  // finished), so the deadline is timeout_ms.
  auto gather_results = [&](Connector& conn, std::string blob) -> Status {
    GB_ASSIGN_OR_RETURN(std::vector<std::string> blobs, conn.gather(blob, cfg.timeout_ms));
    if (conn.world_rank() != 0) return ok_status();
    root = true;
    out.results.assign(num_requests, {});
    std::vector<bool> filled(num_requests, false);
    for (int w : conn.topology().attention_world) {
      GB_ASSIGN_OR_RETURN(const engine::EngineMetrics m, deserialize_rank(blobs[w], &out.results, &filled));
      merge_metrics(m, out.metrics);
    }
    for (size_t r = 0; r < num_requests; ++r) {
      if (!filled[r]) return internal_error(fmt::format("afd: no attention rank returned request {}", r));
    }
    return ok_status();
  };

  // --weight-quant without weights from the caller: each rank quantizes only its share (see quantize_rank_share).
  std::unique_ptr<model::QuantizedWeights> share;
  EngineJobOptions rank_options = options;
  auto load_share = [&](Connector& conn) -> Status {
    if (options.quantized || !dev.weight_quant()) return ok_status();
    GB_ASSIGN_OR_RETURN(share, quantize_rank_share(conn, checkpoint, dev, cfg, &out.weight_lines));
    rank_options.quantized = share.get();
    return ok_status();
  };
  RankFns fns;
  fns.attention = [&](Connector& conn, Metrics& metrics) -> Status {
    GB_RETURN_IF_ERROR(load_share(conn));
    GB_ASSIGN_OR_RETURN(AttentionRankRun run, run_attention_rank(conn, metrics, checkpoint, dev, requests,
                                                                 pool_pages_per_rank, cfg, eopt, rank_options, true));
    return gather_results(conn, serialize_rank(run.mine, run.results, run.metrics));
  };
  std::unique_ptr<model::ExpertBank> experts;
  fns.ffn = [&](Connector& conn, Metrics& metrics) -> Status {
    GB_RETURN_IF_ERROR(load_share(conn));
    experts = std::make_unique<model::ExpertBank>(checkpoint, rank_options.quantized);
    FfnRunner runner(conn, expert_compute_with_hook(*experts, c, options, conn.rank()), &metrics);
    GB_RETURN_IF_ERROR(runner.run());
    return gather_results(conn, serialize_rank({}, {}, {}));
  };

  JobOptions jo;
  jo.trace_path = options.trace_path;
  jo.trace_events = options.trace_path.empty() ? 0 : (size_t{1} << 18);
  jo.report = &out.report;
  jo.fingerprint = job_fingerprint(checkpoint, dev, requests, pool_pages_per_rank, eopt, options);
  GB_RETURN_IF_ERROR(run_mpi_rank(cfg, declared_role, fns, jo));
  if (!root) return EngineJobResult{};
  out.num_ranks = cfg.num_attention + cfg.num_ffn;
  return out;
}

}  // namespace genbridge::afd
