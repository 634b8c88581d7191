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
#include "afd/engine_attention.h"
#include "afd/engine_ffn.h"
#include "afd/metrics.h"
#include "afd/rank_job.h"
#include "afd/runner.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/executor.h"
#include "runtime/forward/runner.h"

namespace genbridge::afd {

struct EngineJobOptions {
  AfdConfig afd;  // topology, connector, stages, deadlines; model-shape keys are filled from the checkpoint
  // What the tool knows must agree across ranks (flags as typed, a prompt digest, ...). Compared across every
  // rank at init, before what the job adds itself (model config, requests, engine options: see
  // job_fingerprint in afd/rank_job.h); a mismatch ends the job on every rank naming the item, both values
  // and both ranks, before any decoding.
  std::vector<FingerprintItem> fingerprint;
  engine::EngineOptions engine;
  // The first steps of every attention rank are warm-up: computed as any other (results unchanged), left
  // out of the AFD metrics and announced as warm-up on the sync connector's control plane.
  int warmup_steps = 2;
  std::optional<ExpertLoad> expert_load;  // as RankJob::expert_load
  std::string trace_path;  // Chrome/Perfetto trace of every rank (empty: none)
  // Weights quantized at load when the DeviceOperator has weight_quant in force: the attention
  // ranks' projections and shared experts, the FFN ranks' routed experts. Must outlive the job. Required
  // in process (every rank shares them). Under mpirun, when null, each rank quantizes only its own share
  // (an attention rank the attention side, FFN rank f its experts) and the ranks meet before the first step.
  const model::QuantizedWeights* quantized = nullptr;
  // Tests only (fault injection): called on an FFN rank before each work item's expert compute; an error
  // fails that FFN rank. Empty: none.
  std::function<Status(int ffn_rank, const FfnWorkItem& item)> ffn_hook;
  // Tests only (fault injection): called on an attention rank before each step (numbered from 1); an error
  // fails that attention rank. Empty: none.
  std::function<Status(int attention_rank, int64_t step)> attention_hook;
};

struct EngineJobResult {
  std::vector<engine::RequestResult> results;  // in the order the requests were given
  engine::EngineMetrics metrics;               // merged over attention ranks
  AfdReport report;
  int num_ranks = 0;
  // Under mpirun with each rank quantizing its share: one line per rank in world-rank order, "<rank
  // name>: <QuantizedWeights::describe()>" (world rank 0 only).
  std::vector<std::string> weight_lines;
};

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

}  // namespace genbridge::afd
