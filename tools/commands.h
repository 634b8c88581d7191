#pragma once
// The `genbridge` subcommands. Each returns the process exit code and prints its own errors.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace genbridge::tools {

// Exit codes of every subcommand (`run`, `run --afd` and `afd-worker` share one run path).
inline constexpr int kExitOk = 0;      // every request finished (or the command did its work)
inline constexpr int kExitFailed = 1;  // the run failed (model, device, job, I/O); nothing printed as a result
inline constexpr int kExitUsage = 2;   // the command line is invalid: a flag's value or a combination of flags
// Some request was refused, or ended by an error (non-finite logits); its line says why, the others finished.
inline constexpr int kExitRefused = 3;

struct MakeModelOptions {
  std::string preset = "tiny";
  int64_t vocab_size = 0;     // 0: the preset's
  std::string tokenizer_dir;  // copy tokenizer.json + tokenizer_config.json from here instead of writing one
  uint64_t seed = 0;
  int shards = 1;
  std::string out_dir;
  std::string weight_quant = "none";  // none | fp8 (Hugging Face FP8 block-scaled)
  double router_skew = 0.0;           // 0: the preset's routing; > 0: a few experts take most tokens
};

struct RunOptions {
  std::string model_dir;  // empty: the cached synthetic model of `preset`
  std::string preset = "small";
  uint64_t model_seed = 0;
  int num_prompts = 8;
  int prompt_len = 32;
  std::vector<std::string> prompts;                 // explicit prompts as typed (comma-separated token ids)
  std::vector<std::vector<int32_t>> prompt_tokens;  // the same, parsed
  std::vector<std::string> prompt_texts;            // --prompt-text as typed
  // --prompt-text's ids: filled by the run path once the model directory's tokenizer.json is loaded.
  std::vector<std::vector<int32_t>> prompt_text_tokens;
  int max_new_tokens = 32;
  std::vector<int32_t> stop_tokens;
  float temperature = 0.f;
  int top_k = 0;
  float top_p = 1.f;
  uint64_t seed = 0;
  int max_batch = 32;
  int64_t max_num_batched_tokens = 0;  // chunked prefill's token budget per step; 0: none
  std::string preemption = "off";      // off | recompute (engine::Preemption)
  // engine::EngineOptions::prefix_caching; on by default (vLLM's), off where the engine cannot cache.
  bool enable_prefix_caching = true;
  int64_t kv_memory_mb = 0;  // 0: enough for every request
  std::string kv_cache_dtype = "auto";
  std::string weight_quant = "none";  // none | auto | w8a8 | mxfp8 | mxfp4
  std::string moe_dispatch = "bf16";  // bf16 | quantized (the routed experts' input; what AFD dispatches)
  std::string soc;
  int threads = 0;
  std::string dump_logits;
  std::string dump_choices;  // JSON lines of routing and indexer choices
  bool quiet = false;
  bool no_mmap = false;        // read the checkpoint into memory instead of mapping it
  bool check_weights = false;  // scan every weight for NaN / Inf at load
  // AFD
  std::string afd;  // e.g. "2A1F"; empty: monolithic
  std::string afd_connector = "sync";
  int afd_stages = 1;
  std::string afd_transport = "inproc";
  double afd_timeout_s = 30.0;
  // The link model (docs/afd.md): one-way latency and bandwidth added to every AFD transfer; 0 = none.
  int64_t afd_link_latency_us = 0;
  double afd_link_gbps = 0.0;
  // Redundant experts (docs/afd.md, "Redundant experts"): copies per MoE layer, the measured load they are
  // placed from, and (run, afd-worker) where to write the load this run measured.
  int afd_redundant_experts = 0;
  std::string afd_expert_load;
  std::string afd_expert_load_out;
  int afd_warmup_steps = 2;                // first steps of each attention rank left out of the AFD metrics
  std::string scheduling_policy = "fcfs";  // serve: fcfs | priority (engine::SchedulingPolicy)
  std::string trace;
  // Flags given on the command line, as their long names ("--afd-stages"): combinations are checked on it.
  std::set<std::string> given;
};

// `genbridge serve`: the run flags that apply to a server (model, device, batching, KV pool) and its own.
// Most HTTP threads serve starts, given (--http-threads) or by default (one per running or waiting request):
// each is a thread of this process started at the listener, so the default of a huge --max-queued-requests
// would exhaust the machine's threads.
inline constexpr int kMaxHttpThreads = 16384;

struct ServeOptions {
  RunOptions run;  // --model, --preset, --model-seed, --max-batch, --kv-memory-mb, --kv-cache-dtype, --soc, ...
  std::string host = "127.0.0.1";
  int port = 8000;                              // 0: any free port (see port_file)
  std::string port_file;                        // written with the bound port once listening
  std::vector<std::string> served_model_names;  // --served-model-name (repeatable); default: the model directory's
  std::string chat_template;                    // --chat-template: a file, or the template itself; empty: the model's
  std::string generation_config = "auto";       // --generation-config: auto | vllm | a directory
  std::string override_generation_config;       // --override-generation-config: a JSON object
  std::string reasoning_parser;                 // --reasoning-parser: qwen3 | deepseek_r1; empty: none
  std::vector<std::string> api_keys;            // --api-key (repeatable)
  std::vector<std::string> allowed_origins;     // --allowed-origins (repeatable, or a JSON list)
  int max_queued_requests = 64;                 // accepted requests waiting to start; more get 429
  int default_max_tokens = 256;                 // when a request gives no max_tokens
  int http_threads = 0;                         // 0: --max-batch x attention ranks + --max-queued-requests + 8
  double request_timeout_s = 600;               // a request still running then is cancelled (504)
  int max_body_mb = 16;                         // a request body beyond it is refused (413) while it is read
  double shutdown_timeout_s = 30;               // SIGTERM: in-flight requests get this long, then are cancelled
  std::string role;  // --afd-transport mpi: "attention", "ffn" or empty (roles from rank order)
};

int make_model(const MakeModelOptions& o);
int serve(const ServeOptions& o);
int run(const RunOptions& o);
// One process of an mpirun AFD job; `role` is "attention", "ffn" or empty (roles from rank order).
int afd_worker(const RunOptions& o, const std::string& role);
int info(const std::string& soc);

}  // namespace genbridge::tools
