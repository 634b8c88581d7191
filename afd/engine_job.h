#pragma once
// The real engine on an AFD topology: attention ranks run the engine (scheduler, KV pool, attention,
// router, LM head) with an AfdExecutor that sends each MoE layer's tokens to the FFN ranks; FFN ranks
// compute their experts with the same stable operators as the monolithic engine. Because every kernel is
// batch-invariant and moe_combine sums slots in a fixed order, tokens and logits equal the monolithic
// engine's bit for bit.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "afd/config.h"
#include "afd/metrics.h"
#include "afd/runner.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/executor.h"
#include "runtime/model/checkpoint.h"
#include "runtime/model/runner.h"

namespace genbridge::afd {

// Attention ranks that run in lockstep (sync connector) agree before every step whether any of them still
// has work; idle ones then send an empty step. Blocks until every attention rank has called.
class StepAgreement {
 public:
  virtual ~StepAgreement() = default;
  virtual Result<bool> any_active(bool mine) = 0;
};

// ForwardExecutor of an attention rank: one forward = one AFD step over `stages` micro-batches.
class AfdExecutor final : public engine::ForwardExecutor {
 public:
  // None of the references are owned; all must outlive the executor. `agreement` may be nullptr (the
  // attention ranks step independently: async connector with async_dp, or a single attention rank).
  AfdExecutor(const model::ModelRunner& runner, AttentionRunner& attention, int stages, StepAgreement* agreement);
  const model::ModelConfig& config() const override { return runner_.config(); }
  Status forward(const model::ForwardInput& input, std::span<float> logits) override;
  // After the engine finished: keeps sending empty steps while another lockstep rank has work, then tells
  // the FFN ranks this rank is done.
  Status finish();
  int64_t steps() const { return step_; }

 private:
  const model::ModelRunner& runner_;
  AttentionRunner& attention_;
  StepAgreement* agreement_;
  std::vector<model::ForwardBatch> batches_;
  std::vector<int64_t> planned_tokens_, planned_seqs_;
  int64_t step_ = 0;
};

// FFN-side work item computation with the model's experts (reuses one scratch buffer; single-threaded
// caller, as FfnRunner is).
ExpertComputeFn make_expert_compute(const model::ExpertBank& experts, int64_t top_k, int64_t hidden);

// One setting that every rank of a job must agree on, as the user gave it: `name` is the flag as typed
// ("--max-new-tokens") or a derived item ("model weights"), `value` its printable value or a digest.
struct FingerprintItem {
  std::string name;
  std::string value;
};

struct EngineJobOptions {
  AfdConfig afd;  // topology, connector, stages, deadlines; model-shape keys are filled from the checkpoint
  // Compared across every rank at init; a mismatch ends the job naming the item and both values.
  std::vector<FingerprintItem> fingerprint;
  engine::EngineOptions engine;
  std::string trace_path;  // Chrome/Perfetto trace of every rank (empty: none)
  // Tests only (fault injection): called on an FFN rank before each work item's expert compute; an error
  // fails that FFN rank. Empty: none.
  std::function<Status(int ffn_rank, const FfnWorkItem& item)> ffn_hook;
};

struct EngineJobResult {
  std::vector<engine::RequestResult> results;  // in the order the requests were given
  engine::EngineMetrics metrics;              // merged over attention ranks
  AfdReport report;
  int num_ranks = 0;
};

// Fills the model-shape keys of `afd` (experts, top-k, hidden size, layers, dense layers) and sizes the
// per-stage buffers for `max_tokens_per_stage` tokens.
Status fill_model_shape(const model::ModelConfig& cfg, int64_t max_tokens_per_stage, AfdConfig* afd);

// Runs every rank of the job as threads of this process (in-process transport). Request r goes to
// attention rank r % A. Each attention rank has its own KV pool of `pool_pages_per_rank` pages.
Result<EngineJobResult> run_inproc_engine_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                              std::vector<engine::Request> requests, int64_t pool_pages_per_rank,
                                              const EngineJobOptions& options);

// Runs this process's rank of an MPI job (launched by mpirun; `declared_role` as in run_mpi_rank) with
// the real engine. Every process passes the same requests; request r goes to attention rank r % A, whose
// KV pool has `pool_pages_per_rank` pages. Attention ranks gather their results and metrics to world
// rank 0 (Connector::gather, called by every rank in the same order), so world rank 0 returns every
// result in request order, the merged metrics and the report; other ranks return an empty result
// (num_ranks == 0). `dev` is used by attention ranks only. Errors: the transport cannot start (e.g. not
// under mpirun) is returned; any later failure ends the whole job (MPI_Abort; does not return).
Result<EngineJobResult> run_mpi_engine_rank(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                                            std::vector<engine::Request> requests, int64_t pool_pages_per_rank,
                                            const EngineJobOptions& options, int declared_role);

// StepAgreement among the attention ranks of an MPI job: a logical-or all-reduce on a communicator of the
// attention ranks (`attention_world_ranks`, in attention-rank order), polled against `timeout_ms`.
// Collective over the attention ranks only; call after the connector's init(). Unavailable in a build
// without MPI.
Result<std::unique_ptr<StepAgreement>> make_mpi_step_agreement(std::span<const int> attention_world_ranks,
                                                               int attention_rank, int64_t timeout_ms);

}  // namespace genbridge::afd
