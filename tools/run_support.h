#pragma once
// The pieces of the one run path (tools/cmd_run.cpp) that `run`, `run --afd` and `afd-worker` share, and the
// start-up `serve` shares with them: flag checks, device and model, requests, the engines' options, progress
// and result printing.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "afd/config.h"
#include "afd/placement.h"
#include "genbridge/core/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/assembly.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/quant_weights.h"
#include "runtime/memory/kv_page_pool.h"
#include "text/tokenizer.h"
#include "tools/commands.h"

namespace genbridge::tools {

enum class RunMode {
  kMonolithic,  // `run`
  kAfdInproc,   // `run --afd`: every rank a thread of this process
  kAfdMpi,      // `afd-worker`: this process is one rank of an mpirun job
};
// "run" or "afd-worker": the subcommand, as messages name it.
const char* run_command_name(RunMode mode);

// Every rule on the flags that needs no model, in one place: combinations (a flag that would be ignored
// is an error), the AFD settings, GENBRIDGE_NUM_THREADS, --kv-memory-mb against this machine's memory,
// and the output files (--dump-logits, --trace; see runtime/engine/npy.h). InvalidArgument naming the flag
// as typed and its value (a usage error). Cheap: run it before any work.
Status check_run_flags(const RunOptions& o, RunMode mode);
// The rules that need the model's config: token ids inside the vocabulary, prompt + new tokens inside
// max_position_embeddings, experts divisible over the FFN ranks. InvalidArgument naming the flag.
Status check_run_flags_against_model(const RunOptions& o, RunMode mode, const model::ModelConfig& cfg);
// Of those, the engine's (every command that runs one, serve without --afd too): --enable-prefix-caching is refused
// for models with per-sequence state.
Status check_engine_flags_against_model(const RunOptions& o, const model::ModelConfig& cfg);

// The AFD settings of --afd, --afd-connector, --afd-stages, --afd-timeout, --afd-transport (checked by
// check_run_flags first).
Result<afd::AfdConfig> afd_config_from(const RunOptions& o, RunMode mode);
// The measured expert load --afd-expert-load names (none without it); the flag and --afd-redundant-experts
// need each other.
Result<std::optional<afd::ExpertLoad>> expert_load_from(const RunOptions& o);
// ", N redundant experts per MoE layer placed from FILE" with --afd-redundant-experts; "" without.
std::string describe_redundant_experts(const RunOptions& o);

// The DeviceOperator for --soc (else GENBRIDGE_SOC) and --kv-cache-dtype.
Result<runtime::DeviceOperator> make_device(const RunOptions& o);
// The checkpoint's weights quantized into the DeviceOperator's weight_quant representation (null when none
// is in force); `show`: progress on a terminal (stderr).
Result<std::unique_ptr<model::QuantizedWeights>> quantize_weights(const model::Checkpoint& ckpt,
                                                                  const runtime::DeviceOperator& dev, bool show);
// One line: the weight scheme in force, the weight bytes (quantized and bf16) and what ran in place of the
// checkpoint's own FP8 / MXFP4 weights (converted, with the measured error, or dequantized to bf16).
std::string describe_weights(const model::Checkpoint& ckpt, const model::QuantizedWeights* q);
// The model directory: --model, or the cached synthetic model of --preset (built on first use when `build`).
Result<std::filesystem::path> resolve_model_dir(const RunOptions& o, bool build);
// Where the cached synthetic model of --preset / --model-seed lives (built or not).
std::filesystem::path synthetic_model_dir(const RunOptions& o);
// tokenizer.json + tokenizer_config.json for a synthetic preset (text::write_synthetic_tokenizer with the
// preset's vocabulary) into `dir`.
Status write_preset_tokenizer(std::string_view preset, const std::filesystem::path& dir);
// The explicit prompts' ids: --prompt's, else --prompt-text's (once encoded); empty: generated prompts.
const std::vector<std::vector<int32_t>>& explicit_prompt_tokens(const RunOptions& o);
// Whether the prompts are explicit (--prompt or --prompt-text) rather than generated.
bool has_explicit_prompts(const RunOptions& o);
// `text` as a JSON string literal ("..." with control characters, quotes and backslashes escaped): one line.
std::string json_quoted(std::string_view text);
// --prompt-text needs `dir`/tokenizer.json: InvalidArgument (a usage error) naming the file when it is missing.
Status check_model_has_tokenizer(const std::filesystem::path& dir);
// --prompt-text: encodes every prompt with `tokenizer` into o->prompt_text_tokens. InvalidArgument naming the
// prompt when its text cannot be encoded (invalid UTF-8) or encodes to no token.
Status encode_prompt_texts(const text::Tokenizer& tokenizer, RunOptions* o);
// The requests of a run: explicit --prompt / --prompt-text ids or deterministic generated prompts.
std::vector<engine::Request> make_requests(const RunOptions& o, int64_t vocab);
// Checkpoint::open of `dir` with --no-mmap; with --check-weights also scans every weight (refusing a
// non-finite one) and prints the scan's cost to stderr. `populate`: LoadOptions::populate.
Result<model::Checkpoint> open_checkpoint(const std::filesystem::path& dir, const RunOptions& o, bool populate = true);
// One line: architecture, sizes, norm type, weights; a second when the checkpoint has tensors text serving
// ignores (Qwen3.5's vision tower and MTP head), with their count.
std::string describe_model(const model::Checkpoint& ckpt);
// --kv-memory-mb and the job's pools: `num_pools` pools share the requests (request r to pool r % num_pools),
// `pools_in_process` of them in this process; `whole_context_seqs` > 0 (serve): room for that many sequences
// of the whole context when no budget is given (engine::KvPoolOptions). The one place the flag is read.
engine::KvPoolOptions kv_pool_options(const RunOptions& o, int num_pools, int pools_in_process,
                                      int64_t whole_context_seqs = 0);
// What each engine of the job is assembled with (engine::assemble_engine), read from the flags once: --max-batch,
// --dump-logits, --dump-choices, the KV pool (kv_pool_options) and `quantized` (start_model's weights).
engine::AssemblyOptions assembly_options(const RunOptions& o, const engine::KvPoolOptions& kv_pool,
                                         const model::QuantizedWeights* quantized);

// A subcommand's error reporting: "genbridge <command>: <why>" on stderr, and its exit code.
struct Reporter {
  const char* command;
  int usage(const Status& s) const;  // the message; kExitUsage
  int fail(const Status& s) const;   // the status with its code; kExitFailed
};

// How `run`, `afd-worker` and `serve` start: flags (checked by the caller) -> device -> model directory ->
// [at_model_dir] -> checkpoint -> quantized weights (engine::weight_quant_timing), the pages following with
// kv_pool_options.
struct StartOptions {
  RunMode mode = RunMode::kMonolithic;
  bool log = true;          // print the device, CPU target, model and weight lines as they come (stderr)
  bool build_model = true;  // build the synthetic model of --preset when it is not cached (not under mpirun)
  bool populate = true;     // pre-read every mapped page (an FFN rank reads its experts only)
  // Between the model directory and the checkpoint (serve: the tokenizer): returns kExitOk to go on, else the
  // exit code once it printed its error; may append lines (each ending in a newline) to print after the
  // model's. Empty: none.
  std::function<int(const std::filesystem::path& dir, std::string* log_lines)> at_model_dir;
};
// What a started job holds; the engines refer to it (held by unique_ptr: it does not move).
struct StartedModel {
  runtime::DeviceOperator dev;
  std::filesystem::path dir;
  model::Checkpoint ckpt;
  // engine::WeightQuantTiming::kAtLoad: quantized here, shared by every engine of this process; else null.
  std::unique_ptr<model::QuantizedWeights> quantized;
};
// The start, printing the lines `options.log` asks for; on failure prints the error, sets *exit_code
// (kExitUsage or kExitFailed) and returns null.
std::unique_ptr<StartedModel> start_model(const RunOptions& o, const StartOptions& options, const Reporter& report,
                                          int* exit_code);

// One line per request: its tokens, or why it was refused or ended by an error. With `tokenizer`, each
// finished request gets a second line `request N text: "..."`: its tokens decoded, as a JSON string.
void print_results(const std::vector<engine::RequestResult>& results, const text::Tokenizer* tokenizer = nullptr);
// `num_ranks`: devices the throughput is divided by (AFD counts every rank).
void print_metrics(const engine::EngineMetrics& m, const runtime::DeviceOperator& dev, const model::ModelConfig& cfg,
                   int64_t num_requests, int num_ranks);
// Writes --dump-choices: JSON lines, grouped by request in request order (docs/deepseek.md).
Status dump_choices(const std::string& path, const std::vector<engine::RequestResult>& results);
// Writes --dump-logits (rows grouped by request, in request order).
Status dump_logits(const std::string& path, const std::vector<engine::RequestResult>& results, int64_t vocab);

// Single-line progress on stderr (only when stderr is a terminal, or always with a final newline otherwise).
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet);
  void update(const engine::Progress& p);
  void clear();

 private:
  bool quiet_, tty_;
  double start_, last_print_ = -1;
  bool printed_ = false;
};

}  // namespace genbridge::tools
