#include "afd/engine_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "afd/byte_codec.h"
#include "afd/job.h"
#include "afd/transports/step_agreement.h"

namespace genbridge::afd {
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
  into.preemptions += m.preemptions;
  into.recomputed_tokens += m.recomputed_tokens;
  into.prefix_cache_queries += m.prefix_cache_queries;
  into.prefix_cache_hits += m.prefix_cache_hits;
  into.prefix_cache_evictions += m.prefix_cache_evictions;
  into.prefix_cache_pages += m.prefix_cache_pages;
}

// Byte serialisation of one attention rank's results and metrics for Connector::gather.
std::string serialize_rank(const std::vector<size_t>& indices, const std::vector<engine::RequestResult>& results,
                           const engine::EngineMetrics& m) {
  ByteWriter w;
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
  w.put(m.preemptions);
  w.put(m.recomputed_tokens);
  w.put(m.prefix_cache_queries);
  w.put(m.prefix_cache_hits);
  w.put(m.prefix_cache_evictions);
  w.put(m.prefix_cache_pages);
  return w.take();
}

// Stores a rank's results at their request indices and returns its metrics.
Result<engine::EngineMetrics> deserialize_rank(std::string_view blob, std::vector<engine::RequestResult>* results,
                                               std::vector<bool>* filled) {
  ByteReader rd(blob);
  const uint64_t n = rd.get<uint64_t>();
  for (uint64_t i = 0; i < n && rd.ok(); ++i) {
    const uint64_t index = rd.get<uint64_t>();
    if (!rd.ok()) break;
    if (index >= results->size() || (*filled)[index]) {
      return internal_error(fmt::format("afd: a gathered engine result names request {} twice or out of range", index));
    }
    engine::RequestResult& r = (*results)[index];
    int32_t reason = 0;
    std::vector<char> msg;
    rd.get(&r.id);
    rd.get(&reason);
    rd.get_vec(&r.tokens);
    rd.get_vec(&msg);
    rd.get_vec(&r.logits);
    rd.get_vec(&r.choices.records);
    rd.get_vec(&r.choices.expert_ids);
    rd.get_vec(&r.choices.expert_weights);
    rd.get_vec(&r.choices.index_positions);
    if (!rd.ok()) break;
    r.reason = static_cast<engine::FinishReason>(reason);
    r.message.assign(msg.begin(), msg.end());
    (*filled)[index] = true;
  }
  engine::EngineMetrics m;
  rd.get(&m.prefill_tokens);
  rd.get(&m.decode_tokens);
  rd.get(&m.prefill_seconds);
  rd.get(&m.decode_seconds);
  rd.get_vec(&m.ttft_seconds);
  rd.get_vec(&m.tpot_seconds);
  rd.get(&m.kv_bytes_per_token);
  rd.get(&m.requests_finished);
  rd.get(&m.requests_refused);
  rd.get(&m.requests_failed);
  rd.get(&m.preemptions);
  rd.get(&m.recomputed_tokens);
  rd.get(&m.prefix_cache_queries);
  rd.get(&m.prefix_cache_hits);
  rd.get(&m.prefix_cache_evictions);
  rd.get(&m.prefix_cache_pages);
  if (!rd.ok()) return internal_error("afd: a gathered engine result is truncated");
  if (!rd.done()) return internal_error("afd: a gathered engine result has trailing bytes");
  return m;
}

// One attention rank's share of a batch job: its requests (r % A == its rank), in submission order.
struct AttentionRankRun {
  std::vector<size_t> mine;  // request indices
  std::vector<engine::RequestResult> results;
  engine::EngineMetrics metrics;
};

// The batch driver of an attention rank: submits its requests, runs them to completion and hands what it
// computed to `done`. `meet_at_end`: the attention ranks meet before `done` (they may finish far apart).
AttentionDriver batch_driver(const std::vector<engine::Request>& requests, const AfdConfig& cfg, bool meet_at_end,
                             std::function<Status(Connector& conn, AttentionRankRun run)> done) {
  return [&requests, &cfg, meet_at_end, done = std::move(done)](Connector& conn, Metrics&,
                                                                AttentionEngine& e) -> Status {
    const int a = e.attention_rank, A = cfg.num_attention;
    std::unique_ptr<StepAgreement> all_done;
    if (meet_at_end && A > 1) {
      // Attention ranks that step independently (async_dp) may finish far apart: they meet here before the
      // results are gathered. A rank still decoding may take long (idle_timeout_ms); one that stopped is
      // caught sooner by the FFN ranks, which it owes its next step within timeout_ms.
      GB_ASSIGN_OR_RETURN(
          all_done,
          make_step_agreement(conn.transport(), attention_agreement(conn, 1, cfg.idle_timeout_ms, "finish decoding")));
    }
    AttentionRankRun run;
    for (size_t r = static_cast<size_t>(a); r < requests.size(); r += static_cast<size_t>(A)) {
      run.mine.push_back(r);
      GB_RETURN_IF_ERROR(e.engine.submit(requests[r]));
    }
    GB_RETURN_IF_ERROR(e.engine.run_to_completion());
    GB_RETURN_IF_ERROR(e.executor.finish());
    if (all_done) GB_RETURN_IF_ERROR(all_done->any_active(false).status());
    run.results = e.engine.results();
    run.metrics = e.engine.metrics();
    return done(conn, std::move(run));
  };
}

RankJob batch_rank_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev, int64_t pool_pages,
                       const EngineJobOptions& options, TransportKind transport) {
  return RankJob{.checkpoint = &checkpoint,
                 .dev = &dev,
                 .pool_pages = pool_pages,
                 .engine = options.engine,
                 .warmup_steps = options.warmup_steps,
                 .expert_load = options.expert_load,
                 .quantized = options.quantized,
                 // Under mpirun each rank quantizes its share; in process every rank shares the caller's.
                 .quantize_own_share = transport == TransportKind::kMpi,
                 .ffn_hook = options.ffn_hook,
                 .attention_hook = options.attention_hook};
}

JobOptions batch_job_options(const EngineJobOptions& options, AfdReport* report) {
  JobOptions jo;
  jo.trace_path = options.trace_path;
  jo.trace_events = options.trace_path.empty() ? 0 : (size_t{1} << 18);
  jo.report = report;
  return jo;
}

}  // namespace

Result<EngineJobResult> run_inproc_engine_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                              std::vector<engine::Request> requests, int64_t pool_pages_per_rank,
                                              const EngineJobOptions& options) {
  RankJob job = batch_rank_job(checkpoint, dev, pool_pages_per_rank, options, TransportKind::kInproc);
  GB_ASSIGN_OR_RETURN(const ValidAfdConfig cfg, prepare_rank_job(options.afd, TransportKind::kInproc, requests, &job));
  std::vector<engine::RequestResult> results(requests.size());
  std::vector<engine::EngineMetrics> rank_metrics(static_cast<size_t>(cfg->num_attention));
  const AttentionDriver attention =
      batch_driver(requests, cfg, /*meet_at_end=*/false, [&](Connector& conn, AttentionRankRun run) {
        for (size_t i = 0; i < run.mine.size(); ++i) results[run.mine[i]] = std::move(run.results[i]);
        rank_metrics[conn.rank()] = std::move(run.metrics);
        return ok_status();
      });
  const FfnDriver ffn;
  EngineJobResult out;
  JobOptions jo = batch_job_options(options, &out.report);
  jo.fingerprint = job_fingerprint(job, options.fingerprint, &requests);
  GB_RETURN_IF_ERROR(run_inproc_job(cfg, job_rank_fns(job, cfg, attention, ffn), jo));
  out.results = std::move(results);
  for (const auto& m : rank_metrics) merge_metrics(m, out.metrics);
  out.num_ranks = cfg->num_attention + cfg->num_ffn;
  return out;
}

Result<EngineJobResult> run_mpi_engine_rank(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                            std::vector<engine::Request> requests, int64_t pool_pages_per_rank,
                                            const EngineJobOptions& options, int declared_role) {
  RankJob job = batch_rank_job(checkpoint, dev, pool_pages_per_rank, options, TransportKind::kMpi);
  GB_ASSIGN_OR_RETURN(const ValidAfdConfig cfg, prepare_rank_job(options.afd, TransportKind::kMpi, requests, &job));
  const size_t num_requests = requests.size();
  EngineJobResult out;
  job.on_weight_lines = [&out](std::vector<std::string> lines) { out.weight_lines = std::move(lines); };
  bool root = false;
  // Every rank gathers once, after its role's work: attention ranks their results, FFN ranks nothing.
  // Every rank is due at once (the attention ranks met in all_done; the FFN ranks end when they all
  // finished), so the deadline is timeout_ms.
  auto gather_results = [&](Connector& conn, std::string blob) -> Status {
    GB_ASSIGN_OR_RETURN(std::vector<std::string> blobs, conn.gather(blob, cfg->timeout_ms));
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
  const AttentionDriver attention =
      batch_driver(requests, cfg, /*meet_at_end=*/true, [&](Connector& conn, AttentionRankRun run) {
        return gather_results(conn, serialize_rank(run.mine, run.results, run.metrics));
      });
  FfnDriver ffn;
  ffn.after = [&](Connector& conn) { return gather_results(conn, serialize_rank({}, {}, {})); };
  JobOptions jo = batch_job_options(options, &out.report);
  jo.fingerprint = job_fingerprint(job, options.fingerprint, &requests);
  GB_RETURN_IF_ERROR(run_mpi_rank(cfg, declared_role, job_rank_fns(job, cfg, attention, ffn), jo));
  if (!root) return EngineJobResult{};
  out.num_ranks = cfg->num_attention + cfg->num_ffn;
  return out;
}

}  // namespace genbridge::afd
