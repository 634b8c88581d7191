#pragma once
// One engine, assembled in one place: the KV pool sized for the job, the model runner over it, the
// executor and the engine, owned together. `run`, `serve` and an attention rank of an attention-FFN
// disaggregated job build their engines here; only the executor differs (the monolithic LocalExecutor, or
// the one an attention rank builds over the runner). What the flags say about the pool, the engine and the
// weights is read once into AssemblyOptions.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "genbridge/core/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/executor.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/forward/runner.h"
#include "runtime/memory/kv_page_pool.h"

namespace genbridge::engine {

// Bytes of physical memory of this machine (sysconf), or 0 when unknown.
int64_t physical_memory_bytes();

// How each engine's KV pool is sized (--kv-memory-mb and the job's shape).
struct KvPoolOptions {
  int64_t memory_mb = 0;     // each pool's budget in MiB (--kv-memory-mb); 0: room for the demand below
  int num_pools = 1;         // pools the job's requests are spread over (request r to pool r % num_pools)
  int pools_in_process = 1;  // of them, the pools this process allocates (checked against physical memory)
  // A server (no requests known ahead) with memory_mb 0: room for this many sequences of the whole context in
  // each pool, or half of this machine's memory split over the pools in process when that room would take
  // more. 0: room for every request given at once.
  int64_t whole_context_seqs = 0;
  // Models with per-sequence state (Qwen3.5's linear-attention state, DeepSeek-V4's sliding-window rings and
  // compressors): each pool's state slots, one per sequence it runs at once (--max-batch). They are allocated
  // beside the pages and counted in the budget.
  int64_t state_slots = 0;
};

// The pages of each pool, and what the sizing chose on its own.
struct KvPoolPlan {
  runtime::KvPageGeometry geometry;  // the DeviceOperator's, for the model
  int64_t pages = 0;
  int64_t state_slots = 0;  // KvPoolOptions::state_slots when the model has state, else 0
  int64_t state_bytes = 0;  // state_slots * the geometry's bytes per slot
  int64_t memory_mb = 0;  // the budget in force: KvPoolOptions::memory_mb, or the one the half-memory cap chose
  std::string note;       // a line for the log when the cap chose the budget; empty otherwise
};

// The pages of each pool for `requests` (KvPoolOptions::whole_context_seqs 0) or a server's whole-context
// sequences of `max_position` tokens. Refuses from arithmetic, before anything is allocated, a budget that
// holds no page and pools that would not fit in this machine's physical memory (InvalidArgument naming
// --kv-memory-mb: a usage error). The one place a pool is sized; every process of a job computes the same
// number from the same options.
Result<KvPoolPlan> plan_kv_pool(const KvPoolOptions& options, const runtime::KvPageGeometry& geometry,
                                std::span<const Request> requests, int64_t max_position = 0);
// The same for `config`'s model under `dev` (its KV page geometry).
Result<KvPoolPlan> plan_kv_pool(const KvPoolOptions& options, const runtime::DeviceOperator& dev,
                                const model::ModelConfig& config, std::span<const Request> requests);

// When the weights are quantized into the DeviceOperator's weight_quant representation: the one decision.
enum class WeightQuantTiming {
  kNone,       // no weight_quant in force: bf16 weights
  kAtLoad,     // once by this process, before any request; every engine (and FFN rank) of the process shares them
  kRankShare,  // by each process of a multi-process job, its own rank's share, once it knows its role
};
// `multi_process`: this process is one rank of a job of several processes (under mpirun).
WeightQuantTiming weight_quant_timing(const runtime::DeviceOperator& dev, bool multi_process);

// What an engine needs besides the checkpoint and the DeviceOperator: filled from the flags once.
struct AssemblyOptions {
  EngineOptions engine;  // --max-batch, --dump-logits (record_logits), --dump-choices (record_choices)
  KvPoolOptions kv_pool;
  // The weights the runner computes with while weight_quant is in force (WeightQuantTiming::kAtLoad: the
  // process's; kRankShare: the rank's share, once loaded); null for bf16. Not owned; must outlive the engine.
  const model::QuantizedWeights* quantized = nullptr;
};

// Builds the engine's executor over the assembled runner (e.g. an attention rank's AFD executor, which may
// keep a non-owning pointer to it). The assembly owns what it returns and destroys it before the runner.
using ExecutorFactory = std::function<Result<std::unique_ptr<ForwardExecutor>>(const model::ModelRunner& runner)>;

// The pool, runner, executor and engine of one engine, destroyed in reverse order (the members' order).
// Not movable (the engine and the runner refer to the pool): held by unique_ptr.
struct AssembledEngine {
  runtime::KvPagePool pool;
  std::unique_ptr<model::ModelRunner> runner;
  std::unique_ptr<ForwardExecutor> executor;
  std::unique_ptr<Engine> engine;

  explicit AssembledEngine(runtime::KvPagePool p) : pool(std::move(p)) {}
  AssembledEngine(const AssembledEngine&) = delete;
  AssembledEngine& operator=(const AssembledEngine&) = delete;
};

// Assembles one engine over a pool of `pages` pages (plan_kv_pool's) and options.kv_pool.state_slots state
// slots (for a model with per-sequence state), with `options.quantized` weights and
// `make_executor`'s executor (empty: a LocalExecutor running the whole model here). `checkpoint`, `dev` and
// the weights must outlive it. Errors: the pool cannot be allocated, the runner refuses the checkpoint or the
// weights, or `make_executor` fails.
Result<std::unique_ptr<AssembledEngine>> assemble_engine(const model::Checkpoint& checkpoint,
                                                         const runtime::DeviceOperator& dev, int64_t pages,
                                                         const AssemblyOptions& options,
                                                         const ExecutorFactory& make_executor = {});

// The KV representation in force for `config` on `dev`, as the run summary prints it: the MLA latent-row
// format (and the indexer keys' where the model has an indexer), DeepSeek-V4's shared K = V rows (and indexer
// keys) with the compressed entries the pages hold, or the KV cache format, with `kv_bytes_per_token` (all
// layers) and the layer count; then what the state slots hold, for a model with per-sequence state.
std::string describe_kv_representation(const runtime::DeviceOperator& dev, const model::ModelConfig& config,
                                       int64_t kv_bytes_per_token);
// The pool `plan` sized for `config` on `dev`, as a server's start-up prints it: the pages (and their MiB), the
// state slots of a model with per-sequence state, and the KV representation (describe_kv_representation, with
// the geometry's bytes per token). `per_attention_rank`: the plan is each attention rank's (AFD).
std::string describe_kv_pool(const KvPoolPlan& plan, const runtime::DeviceOperator& dev,
                             const model::ModelConfig& config, bool per_attention_rank);

}  // namespace genbridge::engine
