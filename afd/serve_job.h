#pragma once
// Serving on an AFD topology (`genbridge serve --afd`): every attention rank runs a continuous-batching
// engine that a server feeds request by request for as long as it runs; FFN ranks serve their experts.
//
// Keep-alive. FFN ranks treat silence from an attention rank that has started and not finished as a
// failure after timeout_ms (twice that for the sync connector's next step), so that a dead or stopped
// attention rank ends the job. A server is idle for as long as it has no request, so an idle attention
// rank sends an empty step (every MoE layer's transfers with 0 tokens, as an idle lockstep rank does)
// whenever keep_alive_ms (timeout_ms / 4) passed since its last step. Every wait stays bounded: an FFN rank
// still gives up on an attention rank that stops sending even those, and an attention rank on an FFN rank
// that stops answering them (both name the rank).
//
// Lockstep (sync connector with several attention ranks): the attention ranks agree before every step
// whether any of them has work (AfdExecutor::forward, or AttentionIdle::idle for a rank without work: it
// then sends an empty step beside the others' real one). When none has work they answer a second
// question, whether any of them wants to go on: if so every one of them sends an empty step (the
// keep-alive), if not every one of them stops (the server is shutting down). Both answers are the same on
// every rank, so the ranks' step numbers never diverge. An idle lockstep rank sleeps at most keep_alive_ms
// between agreements (a server wakes it earlier when a request arrives for any rank).
//
// Relayed attention ranks (under mpirun with several attention ranks: only world rank 0 serves HTTP):
// attention rank 0's server feeds the other attention ranks through the relay (afd/serve_relay.h) on its own
// thread; each of them runs what it is sent on its engine and reports back, idling through its own
// AttentionIdle. Attention rank 0 starts serving once every other attention rank's engine is up.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "afd/config.h"
#include "afd/connector.h"
#include "afd/engine_attention.h"
#include "afd/metrics.h"
#include "afd/placement.h"
#include "afd/serve_relay.h"
#include "afd/work_wait.h"
#include "genbridge/core/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::afd {

// The idle side of one attention rank's serving loop (see the top of this file).
class AttentionIdle {
 public:
  // `after_step` (optional) is called after every empty step this sends.
  AttentionIdle(AfdExecutor& executor, int64_t keep_alive_ms, std::function<void()> after_step = {})
      : executor_(executor), keep_alive_ms_(keep_alive_ms), after_step_(std::move(after_step)) {}
  // Called by the serving loop whenever its engine has no work. `want_stop`: this rank would stop now (the
  // server is shutting down and holds nothing more for it). `wait(timeout, others)` blocks at most
  // `timeout` for something to do; with `others` it also returns (kOther) at once while another attention
  // rank of this process has a request to serve (a lockstep rank steps beside it). Returns true when the
  // loop must stop (every attention rank wants to); false to go on (the loop looks for work again). Sends
  // empty steps as the keep-alive and the lockstep require.
  Result<bool> idle(bool want_stop, const std::function<WorkWait(std::chrono::milliseconds, bool others)>& wait);
  int64_t keep_alive_steps() const { return keep_alive_steps_; }

 private:
  Status empty_step();
  AfdExecutor& executor_;
  const int64_t keep_alive_ms_;
  std::function<void()> after_step_;
  bool others_active_ = false;  // lockstep: another rank had work at the last agreement
  int64_t steps_seen_ = 0;      // lockstep: the executor's steps when the last idle call returned
  int64_t keep_alive_steps_ = 0;
};

// Counters a server shows in /metrics while the job runs, written by the ranks of this process after each
// of their steps (attention) or work items (FFN) and read by any thread.
struct ServeLiveMetrics {
  std::atomic<int64_t> prefill_steps{0}, decode_steps{0}, empty_steps{0};
  std::atomic<int64_t> attention_to_ffn_bytes{0}, attention_to_ffn_messages{0};  // received by FFN ranks here
  std::atomic<int64_t> ffn_to_attention_bytes{0}, ffn_to_attention_messages{0};  // received by attention ranks here
  std::atomic<int64_t> attention_wait_ns{0};  // attention ranks blocked on expert outputs
  std::atomic<int64_t> ffn_busy_ns{0};        // FFN ranks computing experts
  std::atomic<int64_t> ffn_items{0};          // work items served by FFN ranks here
  // Rows (token, top-k slot pairs) FFN ranks here computed per expert, every MoE layer together (the expert
  // load); sized by init_experts() before the job's ranks start, by the serving job.
  std::unique_ptr<std::atomic<int64_t>[]> expert_rows;
  int num_experts = 0;
  void init_experts(int n) {
    expert_rows = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(n));
    num_experts = n;
  }
  // Prometheus text (genbridge_afd_*); `ffn_here`: FFN ranks run in this process (else their counters are
  // left out rather than shown as 0).
  std::string prometheus(bool ffn_here) const;
};

// The serving loop of attention rank `attention_rank`: it owns `engine` (built over `pool`, with the AFD
// executor) until it returns; calls `idle.idle()` whenever the engine has no work. OK once `idle` said
// stop; an error ends the job. `relay`: null, or (attention rank 0 of a relayed job, see above) the other
// attention ranks, which the loop feeds through it on this thread and which must be done before it stops.
using AttentionServeFn = std::function<Status(int attention_rank, engine::Engine& engine, runtime::KvPagePool& pool,
                                              AttentionIdle& idle, RelayHub* relay)>;

struct ServeJobOptions {
  AfdConfig afd;  // topology, connector, stages, deadlines; model-shape keys and buffer sizes are filled here
  engine::EngineOptions engine;  // per attention rank; max_prefill_tokens and max_batch size the transfers
  // Compared across every rank at init (the tool's flags), before what the job adds (model config, weights,
  // engine options, KV pages and format).
  std::vector<FingerprintItem> fingerprint;
  // As EngineJobOptions::quantized: required in process; under mpirun, when null and the DeviceOperator has
  // weight_quant in force, each rank quantizes only its share (quantize_rank_share) before serving.
  const model::QuantizedWeights* quantized = nullptr;
  // Under mpirun with each rank quantizing its share: called on world rank 0 with every rank's line (world-rank
  // order) once all have loaded, before the first step. Optional.
  std::function<void(const std::vector<std::string>& weight_lines)> on_weight_lines;
  ServeLiveMetrics* live = nullptr;  // optional
  std::optional<ExpertLoad> expert_load;  // as RankJob::expert_load
  // Tests only (fault injection), as EngineJobOptions::ffn_hook.
  std::function<Status(int ffn_rank, const FfnWorkItem& item)> ffn_hook;
  // Tests only: in process, relay the attention ranks other than 0 as under mpirun (`serve` then runs on
  // attention rank 0 alone).
  bool relay_in_process = false;
};

// keep_alive_ms of a config: timeout_ms / 4, at least 1.
int64_t keep_alive_ms(const AfdConfig& cfg);

// The longest prompt a serving job takes: a prefill forward must fit the transfer buffers
// (engine.max_prefill_tokens; a longer prompt would run alone in a larger forward).
int64_t max_prompt_tokens(const ServeJobOptions& options);

// Every rank as a thread of this process (in-process transport); `serve` runs on each attention rank's
// thread. Each attention rank has its own KV pool of `pool_pages_per_rank` pages. Returns when every rank
// ended: OK when the attention ranks stopped, else the job's first failure naming the rank.
Status run_inproc_serve_job(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                            int64_t pool_pages_per_rank, const ServeJobOptions& options, const AttentionServeFn& serve);

// This process's rank of an mpirun job (`declared_role` as in run_mpi_rank); `serve` runs on an attention
// rank, or with several attention ranks on attention rank 0 alone, which must then be world rank 0 (the
// others are relayed; `serve` may be empty on every other process). Errors: the transport cannot start
// (e.g. not under mpirun) is returned; any later failure ends the whole job (MPI_Abort; does not return).
Status run_mpi_serve_rank(const model::Checkpoint& checkpoint, const runtime::DeviceOperator& dev,
                          int64_t pool_pages_per_rank, const ServeJobOptions& options, int declared_role,
                          const AttentionServeFn& serve);

}  // namespace genbridge::afd
