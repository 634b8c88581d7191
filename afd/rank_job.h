#pragma once
// One attention rank and one FFN rank of an AFD job on the real engine, whatever drives them: the batch
// job (afd/engine_job.h: submit every request, run to completion, gather the results) and the serving job
// (afd/serve_job.h: the service loop) differ only in their drivers. What both share lives here: the job's
// config and fingerprint, the share of the weights each rank quantizes, the construction of an attention
// rank's engine and the FFN rank's expert loop.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afd/config.h"
#include "afd/connector.h"
#include "afd/engine_attention.h"
#include "afd/job.h"
#include "afd/metrics.h"
#include "afd/placement.h"
#include "afd/runner.h"
#include "afd/transports/step_agreement.h"
#include "genbridge/core/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::afd {

// What every rank of a job is given, whatever drives it. The checkpoint, the DeviceOperator and the
// weights must outlive the job.
struct RankJob {
  const model::Checkpoint* checkpoint = nullptr;
  const runtime::DeviceOperator* dev = nullptr;
  int64_t pool_pages = 0;        // KV pages of each attention rank's pool
  engine::EngineOptions engine;  // each attention rank's engine (prepare_rank_job sizes max_prefill_tokens)
  int warmup_steps = 0;          // AfdExecutor's warm-up steps
  // The measured expert load the copies of AfdConfig::redundant_experts are planned from (afd/placement.h);
  // required when redundant_experts > 0.
  std::optional<ExpertLoad> expert_load;
  const model::QuantizedWeights* quantized = nullptr;  // weights quantized by the caller (null: none)
  // When weight_quant is in force and `quantized` is null: each rank quantizes only its share first
  // (quantize_rank_share), else the ranks run on `quantized` (the runner refuses null under weight_quant).
  bool quantize_own_share = false;
  // Called on world rank 0 with every rank's load line once each rank quantized its share. Optional.
  std::function<void(std::vector<std::string> lines)> on_weight_lines;
  // Tests only (fault injection): before each work item's expert compute on an FFN rank, and before each
  // step (numbered from 1) on an attention rank; an error fails that rank. Empty: none.
  std::function<Status(int ffn_rank, const FfnWorkItem& item)> ffn_hook;
  std::function<Status(int attention_rank, int64_t step)> attention_hook;
};

// The job's config: `settings` (topology, connector, stages, deadlines) with the model-shape keys of the
// checkpoint and `transport`, validated (the one validation of a job's config). Raises
// job->engine.max_prefill_tokens to the longest of `requests` (at least 1) and sizes the per-stage
// buffers for max(max_prefill_tokens, max_batch) tokens.
Result<ValidAfdConfig> prepare_rank_job(AfdConfig settings, TransportKind transport,
                                        const std::vector<engine::Request>& requests, RankJob* job);

// Fills the model-shape keys of `afd` (experts, top-k, hidden size, layers, dense layers), sizes the
// per-stage buffers for `max_tokens_per_stage` tokens and validates the result.
// With redundant_experts > 0, plans the copies (AfdConfig::replicas) from `load` (required then).
Result<ValidAfdConfig> fill_model_shape(const model::ModelConfig& cfg, int64_t max_tokens_per_stage, AfdConfig afd,
                                        const ExpertLoad* load = nullptr);

// What every rank must agree on: the tool's `items` first (named as the user typed them), then what the
// job itself knows, so that a mismatch is caught even when the tool passed nothing: every key of the model
// config, the weights' size, the requests of a batch job (count, a digest of prompts, lengths, stop tokens
// and sampling; `requests` null for a serving job, which says so instead), the warm-up, the engine
// options, the KV pool, the weight quantization and the MoE dispatch. (Topology, connector and stages are AfdConfig
// settings, compared before.)
std::vector<FingerprintItem> job_fingerprint(const RankJob& job, std::vector<FingerprintItem> items,
                                             const std::vector<engine::Request>* requests);

// Under mpirun (`run --afd` and `serve --afd`): quantizes this rank's share of the weights (an
// attention rank the attention side, FFN rank f the experts it owns), then every rank meets before the first
// step: world rank 0 gathers each rank's load line ("<rank name>: <QuantizedWeights::describe()>", into
// `lines`, in world-rank order) and releases every rank once all have loaded, so no rank's step deadline runs
// while another still quantizes. The deadline is the init deadline (loads may end far apart). Every rank of
// the job must call it (dev.weight_quant() in force).
Result<std::unique_ptr<model::QuantizedWeights>> quantize_rank_share(Connector& conn,
                                                                     const model::Checkpoint& checkpoint,
                                                                     const runtime::DeviceOperator& dev,
                                                                     const AfdConfig& cfg,
                                                                     std::vector<std::string>* lines);

// The agreement `id` among the attention ranks of `conn`'s job (see StepAgreementOptions).
StepAgreementOptions attention_agreement(const Connector& conn, int id, int64_t timeout_ms, std::string purpose);

// One attention rank's engine, as its driver sees it while it runs.
struct AttentionEngine {
  int attention_rank = 0;
  engine::Engine& engine;
  runtime::KvPagePool& pool;
  AfdExecutor& executor;
};

// What an attention rank does with its engine: submit and run to completion, or serve; it ends with
// executor.finish(). `conn` and `metrics` are the rank's.
using AttentionDriver = std::function<Status(Connector& conn, Metrics& metrics, AttentionEngine& engine)>;

// What an FFN rank adds around its FfnRunner: `wrap` wraps the expert compute (e.g. to time it); `after`
// runs once FfnRunner::run() returned OK. Both optional.
struct FfnDriver {
  std::function<ExpertComputeFn(Connector& conn, Metrics& metrics, ExpertComputeFn compute)> wrap;
  std::function<Status(Connector& conn)> after;
};

// The one construction of an attention rank's engine: its KV pool (job.pool_pages pages; job.engine.max_batch
// state slots for a model with linear-attention state), ModelRunner (on
// `quantized`), AfdExecutor (agreeing each step with `lockstep`, which may be null) and Engine, handed to
// `drive` for as long as it runs.
Status with_attention_engine(const RankJob& job, const AfdConfig& cfg, Connector& conn, Metrics& metrics,
                             StepAgreement* lockstep, const model::QuantizedWeights* quantized,
                             const std::function<Status(AttentionEngine& engine)>& drive);

// The functions of both roles: every rank first quantizes its share when the job says so, then an
// attention rank builds its engine (with the lockstep agreement unless its ranks step independently)
// and runs `attention` on it; an FFN rank serves its experts, wrapped and followed as `ffn` says. `job`,
// `cfg` and the drivers must outlive the functions.
RankFns job_rank_fns(const RankJob& job, const ValidAfdConfig& cfg, const AttentionDriver& attention,
                     const FfnDriver& ffn);

}  // namespace genbridge::afd
