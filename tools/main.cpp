// genbridge: the command-line tool. `genbridge run` is the main job; see --help of each subcommand.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>

#include "afd/config.h"
#include "genbridge/core/threading.h"
#include "runtime/device/soc.h"
#include "tools/make_model/synthetic.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/make_model/synthetic.h"

namespace {

using genbridge::tools::add_choice_flag;
using genbridge::tools::add_float_flag;
using genbridge::tools::add_int64_flag;
using genbridge::tools::add_int_flag;
using genbridge::tools::add_int_list_flag;
using genbridge::tools::add_real_flag;
using genbridge::tools::add_string_flag;
using genbridge::tools::add_string_list_flag;
using genbridge::tools::add_uint64_flag;

constexpr const char* kExitCodes =
    "Exit status: 0 every request finished; 3 some request was refused or ended by an error (non-finite\n"
    "logits; its line says why, the others finished); 1 the run failed (nothing is printed as a result);\n"
    "2 the command line is invalid (a flag's value or a combination of flags; checked before any work, token\n"
    "ids once the model is known).";

// The model flags `run`, `afd-worker` and `serve` share.
void add_model_flags(CLI::App* run, genbridge::tools::RunOptions& ro) {
  add_string_flag(run, "--model", &ro.model_dir,
                  "Model directory: config.json + model.safetensors or sharded model-*-of-*.safetensors with\n"
                  "model.safetensors.index.json (Hugging Face layout, Qwen3-MoE family)",
                  "the synthetic model of --preset and --model-seed (built once, cached)");
  add_choice_flag(run, "--preset", &ro.preset, genbridge::model::synthetic_preset_names(),
                  "Synthetic model preset, used when --model is not given (an error with --model)");
  add_uint64_flag(run, "--model-seed", &ro.model_seed,
                  "Seed of the synthetic model's weights, used when --model is not given (an error with --model)");
}

// The batching, KV and device flags `run`, `afd-worker` and `serve` share.
void add_engine_flags(CLI::App* run, genbridge::tools::RunOptions& ro) {
  add_int_flag(run, "--max-batch", &ro.max_batch, 1, 4096, "Most sequences decoded together (continuous batching)");
  add_int_flag(run, "--max-num-seqs", &ro.max_batch, 1, 4096, "--max-batch under vLLM's name (give one of the two)",
               "--max-batch's");
  add_int64_flag(run, "--max-num-batched-tokens", &ro.max_num_batched_tokens, 0, int64_t{1} << 20,
                 "Chunked prefill: at most N tokens per engine step, the running requests' decodes first and\n"
                 "then chunks of the prompts being prefilled, so a long prompt no longer stalls the others'\n"
                 "next tokens (at least --max-batch). 0 = prefill each prompt whole. Same tokens either way");
  add_choice_flag(run, "--preemption", &ro.preemption, {"off", "recompute"},
                  "What a request takes from the KV pool. off: its prompt plus --max-new-tokens (max_tokens),\n"
                  "reserved when it starts, so it never runs out. recompute (vLLM's mode): only the pages it fills,\n"
                  "a page at a time; when none is free the latest-arrived running request is preempted (its pages\n"
                  "freed) and resumed before new requests by feeding its tokens again. Same tokens either way");
  run->add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", ro.enable_prefix_caching,
                "Keep every full KV page (128 tokens) until the pool needs it, named by its tokens and all\n"
                "before them, and start a request on the cached pages of its longest prefix (vLLM's automatic\n"
                "prefix caching). Same tokens either way. On by default; off for models with per-sequence state\n"
                "(Qwen3.5, DeepSeek-V4) and with --dump-choices, where asking for it is refused.\n"
                "Default: on (--no-enable-prefix-caching turns it off)");
  add_int64_flag(run, "--kv-memory-mb", &ro.kv_memory_mb, 0, (int64_t{1} << 43) - 1,
                 "KV cache pool size in MiB (per attention rank with --afd); 0 = room for every request at\n"
                 "once (serve: --max-batch whole contexts, at most half of this machine's memory in all).\n"
                 "Requests that do not fit wait; a request that can never fit is refused with a message.\n"
                 "Must hold one KV page and fit this machine's physical memory (checked before allocating)");
  add_choice_flag(run, "--kv-cache-dtype", &ro.kv_cache_dtype, {"auto", "bf16", "quantized"},
                  "Whether KV is quantized; the generation decides how (int8 or fp8)");
  add_choice_flag(run, "--moe-dispatch", &ro.moe_dispatch, {"bf16", "quantized"},
                  "The routed experts' input: bf16, or quantized in the generation's activation representation\n"
                  "(int8 + fp32 scale per token, or MXFP8 with an e8m0 scale per 32). With --afd it is what the\n"
                  "attention ranks send the FFN ranks; without, the engine quantizes at the same point, so the two\n"
                  "give the same bits. W8A8 experts take int8 codes as they are (docs/afd.md#quantized-dispatch)");
  add_string_flag(run, "--soc", &ro.soc,
                  "SoC the run is meant for; must match this build's generation. Accepted: " +
                      std::string(genbridge::runtime::accepted_soc_selectors()),
                  "GENBRIDGE_SOC, else none (the build's SoC)");
  add_int_flag(run, "--threads", &ro.threads, 0, genbridge::kMaxNumThreads,
               "Kernel threads; 0 = GENBRIDGE_NUM_THREADS (an integer in [1, 255]) or every core");
}

// The loading flags `run`, `afd-worker` and `serve` share; `weight_quant_note`: more help for --weight-quant.
void add_load_flags(CLI::App* run, genbridge::tools::RunOptions& ro, const std::string& weight_quant_note = "") {
  add_choice_flag(run, "--weight-quant", &ro.weight_quant, {"none", "auto", "w8a8", "mxfp8", "mxfp4"},
                  "Quantize attention projections and experts at load; auto = the generation's preferred\n"
                  "scheme; a scheme the generation cannot run is refused, naming what it offers. Router and LM\n"
                  "head stay bf16" +
                      weight_quant_note);
  run->add_flag("--quiet", ro.quiet, "No progress or log lines on stderr (errors are still printed)");
  run->add_flag("--no-mmap", ro.no_mmap,
                "Read the checkpoint into memory instead of mapping it (for files that may change during the run:\n"
                "truncating a mapped checkpoint kills the process with SIGBUS)");
  run->add_flag("--check-weights", ro.check_weights,
                "Scan every weight at load and refuse the model if one is NaN or infinite, naming it; prints the\n"
                "scan's cost");
}

// The link model's flags `run`, `afd-worker` and `serve` share (docs/afd.md, "The link model").
void add_afd_link_flags(CLI::App* app, genbridge::tools::RunOptions& o) {
  add_int64_flag(app, "--afd-link-latency-us", &o.afd_link_latency_us, 0, genbridge::afd::kMaxLinkLatencyUs,
                 "Link model: one-way latency in microseconds added to every AFD transfer (attention -> FFN and\n"
                 "back), as if ranks sat on different machines; a timed wait, not a spin. 0 = none");
  add_real_flag(app, "--afd-link-gbps", &o.afd_link_gbps, 0, 1e6, false,
                "Link model: bandwidth in Gb/s of each link between two ranks; a transfer occupies its link for\n"
                "bytes x 8 / bandwidth. 0 = unlimited");
}

// The redundant-expert flags `run`, `afd-worker` and `serve` share (docs/afd.md, "Redundant experts").
void add_afd_placement_flags(CLI::App* app, genbridge::tools::RunOptions& o) {
  add_int_flag(app, "--afd-redundant-experts", &o.afd_redundant_experts, 0, 1 << 16,
               "Extra copies of the hottest experts per MoE layer, spread evenly over the FFN ranks (a multiple\n"
               "of F); an expert's rows are split between its copies, bit for bit as without. Needs\n"
               "--afd-expert-load");
  add_string_flag(app, "--afd-expert-load", &o.afd_expert_load,
                  "The measured expert load (JSON, written by run --afd-expert-load-out) the copies are planned\n"
                  "from",
                  "none");
}

// The flags `run` and `afd-worker` share: model, prompts, sampling, batching, AFD settings.
void add_run_options(CLI::App* run, genbridge::tools::RunOptions& ro) {
  constexpr int kMaxTokens = 1 << 20;
  constexpr int kMaxInt32 = std::numeric_limits<int32_t>::max();
  add_model_flags(run, ro);
  add_int_flag(run, "--num-prompts", &ro.num_prompts, 1, 4096,
               "Number of generated prompts (an error with --prompt, --prompt-text)");
  add_int_flag(run, "--prompt-len", &ro.prompt_len, 1, kMaxTokens,
               "Tokens per generated prompt (an error with --prompt, --prompt-text)");
  run->add_option_function<std::vector<std::string>>(
         "--prompt",
         [&ro](const std::vector<std::string>& values) {
           ro.prompts.clear();
           ro.prompt_tokens.clear();
           for (const auto& v : values) {
             auto ids = genbridge::tools::parse_token_list("--prompt", v);
             if (!ids.ok()) throw CLI::ValidationError(ids.status().message());
             ro.prompts.push_back(v);
             ro.prompt_tokens.push_back(std::move(ids).value());
           }
         },
         "An explicit prompt as comma-separated token ids, e.g. 1,2,3 (repeatable, at most 4096 prompts).\n"
         "Each id in [0, 2147483647] and inside the model's vocabulary. Default: --num-prompts generated prompts")
      ->type_name("IDS");
  run->add_option_function<std::vector<std::string>>(
         "--prompt-text",
         [&ro](const std::vector<std::string>& values) {
           ro.prompt_texts.clear();
           for (const auto& v : values) {
             if (v.empty()) throw CLI::ValidationError("--prompt-text '': the prompt is empty");
             ro.prompt_texts.push_back(v);
           }
         },
         "An explicit prompt as text, encoded with the model directory's tokenizer.json (repeatable, at most\n"
         "4096 prompts; an error with --prompt). Each result is also printed decoded, as a JSON string:\n"
         "  request N text: \"...\"\n"
         "Default: none")
      ->type_name("TEXT");
  add_int_flag(run, "--max-new-tokens", &ro.max_new_tokens, 1, kMaxTokens,
               "Tokens to generate per request (prompt + new tokens must fit the model's max_position_embeddings)");
  add_int_list_flag(run, "--stop-token", &ro.stop_tokens, 0, kMaxInt32,
                    "Token id that ends a request when generated (repeatable); must be inside the model's vocabulary");
  add_float_flag(run, "--temperature", &ro.temperature, genbridge::engine::kTemperatureRange,
                 "Sampling temperature; 0 = greedy. Any other value must be a normal float (its reciprocal scales\n"
                 "the logits)");
  add_int_flag(run, "--top-k", &ro.top_k, 0, genbridge::engine::kMaxTopK,
               "Keep the k most likely tokens; 0 (or the vocabulary size or more) = all");
  add_float_flag(run, "--top-p", &ro.top_p, genbridge::engine::kTopPRange,
                 "Nucleus sampling: keep the most likely tokens up to this mass (a normal float in (0, 1])");
  add_uint64_flag(run, "--seed", &ro.seed, "Sampling seed; request r uses seed + r (modulo 2^64)");
  add_engine_flags(run, ro);
  add_string_flag(run, "--dump-logits", &ro.dump_logits,
                  "Write the last-position fp32 logits of every step to FILE.npy, shape (rows, vocab): rows grouped\n"
                  "by request in request order, one row per generated token. Checked before decoding; written\n"
                  "through a temporary file renamed on success (a character device or FIFO is written directly)",
                  "none");
  add_string_flag(run, "--dump-choices", &ro.dump_choices,
                  "Write what the forward pass chose to FILE as JSON lines (docs/deepseek.md, \"Dumping the\n"
                  "choices\"): per request, step, position and MoE or DSA layer, the routed expert ids and weights\n"
                  "and the indexer's top-k positions. Checked and written like --dump-logits",
                  "none");
  add_load_flags(run, ro);
  add_string_flag(run, "--afd", &ro.afd,
                  "Attention-FFN disaggregation topology <A>A<F>F, e.g. 2A1F (2 attention ranks, 1 FFN rank);\n"
                  "A and F in [1, 64]. Every --afd-* flag needs it",
                  "none (monolithic)");
  add_choice_flag(run, "--afd-connector", &ro.afd_connector, {"sync", "async"},
                  "sync (control plane) | async (self-describing messages; attention ranks step independently)");
  add_int_flag(run, "--afd-stages", &ro.afd_stages, 1, genbridge::afd::kMaxStages, "Micro-batch stages per step");
  add_choice_flag(run, "--afd-transport", &ro.afd_transport, {"inproc", "mpi"},
                  "inproc (threads; `run`) | mpi (`genbridge afd-worker` under mpirun)");
  add_real_flag(run, "--afd-timeout", &ro.afd_timeout_s, 0.001, 86400, false, "Deadline in seconds for every AFD wait",
                "a number of seconds");
  add_int_flag(run, "--afd-warmup-steps", &ro.afd_warmup_steps, 0, 1 << 20,
               "First steps of each attention rank that run as usual but are left out of the AFD metrics");
  add_afd_link_flags(run, ro);
  add_afd_placement_flags(run, ro);
  add_string_flag(run, "--afd-expert-load-out", &ro.afd_expert_load_out,
                  "Write the expert load the measured steps saw (rows per expert per MoE layer, JSON) to FILE, for\n"
                  "--afd-expert-load (checked before decoding)",
                  "none");
  add_string_flag(run, "--trace", &ro.trace,
                  "Write a Chrome/Perfetto trace (JSON) of the run to FILE.json: the engine's phases per layer and\n"
                  "step, or with --afd every rank's attention, FFN, transfer and wait spans (checked before decoding)",
                  "none");
}

// The long names of the flags given to `app` (combinations are checked on them).
std::set<std::string> given_flags(const CLI::App* app) {
  std::set<std::string> given;
  for (const CLI::Option* opt : app->get_options()) {
    if (opt->count() > 0) given.insert(opt->get_name());
  }
  return given;
}

// `serve`: the model, engine and load flags of `run`, the server's own and the AFD ones.
CLI::App* add_serve_command(CLI::App* app, genbridge::tools::ServeOptions& so) {
  CLI::App* srv = app->add_subcommand(
      "serve",
      "Serve the model over HTTP with the OpenAI API: POST /v1/completions and /v1/chat/completions (JSON, or\n"
      "server-sent events with \"stream\": true), GET /v1/models and /v1/models/{id}, POST /tokenize and\n"
      "/detokenize, GET /health and /metrics (Prometheus, also under vLLM's names). Every request field of\n"
      "OpenAI's API and vLLM's extensions is honoured or refused by name (docs/serving.md). Text goes through\n"
      "the model directory's tokenizer.json; chat through its chat template; generation_config.json gives the\n"
      "end-of-generation tokens and sampling defaults.\n"
      "Every request runs through the continuous-batching engine. SIGTERM or SIGINT: new requests get 503,\n"
      "in-flight ones finish (cancelled at --shutdown-timeout), then the server exits 0.");
  add_model_flags(srv, so.run);
  add_engine_flags(srv, so.run);
  add_load_flags(srv, so.run,
                 ".\nQuantized once at start-up, before the listener opens; in-process with --afd every rank\n"
                 "shares them; under mpirun (--afd-transport mpi) each rank quantizes only its share (the\n"
                 "attention rank its attention side, an FFN rank its experts) and world rank 0 prints each\n"
                 "rank's line");
  add_string_flag(srv, "--host", &so.host, "Address to listen on", "127.0.0.1");
  add_int_flag(srv, "--port", &so.port, 0, 65535, "Port to listen on; 0 = any free port (see --port-file)");
  add_string_flag(srv, "--port-file", &so.port_file, "Write the bound port to FILE once listening", "none");
  add_string_list_flag(srv, "--served-model-name", &so.served_model_names,
                       "The model names requests may give (\"model\"; a request without one gets the first) and\n"
                       "/v1/models lists; repeat the flag (or give several) for more than one",
                       "the model directory's name");
  add_string_flag(srv, "--chat-template", &so.chat_template,
                  "The chat template for /v1/chat/completions instead of the model's: a Jinja file, or the template\n"
                  "itself (a value holding '{{' or '{%')",
                  "the model directory's chat_template.jinja or tokenizer_config.json's chat_template");
  add_string_flag(srv, "--generation-config", &so.generation_config,
                  "Where the sampling defaults and end-of-generation ids come from: auto (the model directory's\n"
                  "generation_config.json), vllm (none: the API's defaults, the tokenizer's eos token), or a\n"
                  "directory holding a generation_config.json",
                  "auto");
  add_string_flag(srv, "--override-generation-config", &so.override_generation_config,
                  "A JSON object over the generation config's sampling defaults, e.g. '{\"temperature\": 0.5}'\n"
                  "(keys: temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens)",
                  "none");
  add_choice_flag(srv, "--scheduling-policy", &so.run.scheduling_policy, {"fcfs", "priority"},
                  "The order in which waiting requests start: fcfs (arrival; a request's 'priority' must be 0) or\n"
                  "priority (the request's 'priority' field, lowest first, then arrival; as vLLM's). A running\n"
                  "request is preempted only for want of KV pages (--preemption recompute: the highest value first)");
  add_choice_flag(srv, "--reasoning-parser", &so.reasoning_parser, {"qwen3", "deepseek_r1"},
                  "Split a thinking model's chat replies into reasoning_content (<think>...</think>) and content");
  add_string_list_flag(srv, "--api-key", &so.api_keys,
                       "Requests must send 'Authorization: Bearer <key>' with one of these keys (401 otherwise);\n"
                       "/health, /metrics and CORS preflights stay open. Repeatable",
                       "none (no authentication)");
  add_string_list_flag(srv, "--allowed-origins", &so.allowed_origins,
                       "Origins a browser may call the API from (CORS), each an origin such as https://a.example\n"
                       "or * for any; repeatable, or a JSON list as vLLM takes it ('[\"https://a.example\"]')",
                       "none (no cross-origin access)");
  add_int_flag(srv, "--max-queued-requests", &so.max_queued_requests, 1, 1 << 20,
               "Accepted requests waiting to start (beyond the --max-batch running ones); more get 429");
  add_int_flag(srv, "--default-max-tokens", &so.default_max_tokens, 1, 1 << 20,
               "Completion tokens when a request gives no max_tokens (within the context and the KV pool)");
  add_int_flag(srv, "--http-threads", &so.http_threads, 0, genbridge::tools::kMaxHttpThreads,
               "HTTP worker threads (one per open connection); 0 = --max-batch (x attention ranks with --afd) +\n"
               "--max-queued-requests + 8, which must not exceed 16384 either (else exit 2)");
  add_int_flag(srv, "--max-body-mb", &so.max_body_mb, 1, 1024,
               "Largest request body in MiB, however it is framed (Content-Length or chunked); a larger one is\n"
               "refused with 413 while it is read. Bodies nest at most 128 levels of JSON (docs/serving.md)");
  add_real_flag(srv, "--request-timeout", &so.request_timeout_s, 0.001, 86400, false,
                "Seconds a request may take; then it is cancelled and answered 504", "a number of seconds");
  add_real_flag(srv, "--shutdown-timeout", &so.shutdown_timeout_s, 0, 86400, false,
                "Seconds in-flight requests get to finish after SIGTERM / SIGINT; then they are cancelled",
                "a number of seconds");
  add_string_flag(srv, "--afd", &so.run.afd,
                  "Serve with attention-FFN disaggregation, topology <A>A<F>F (e.g. 2A1F). In-process (default),\n"
                  "every rank is a thread and a request goes to the attention rank with the fewest unfinished\n"
                  "requests; under mpirun (--afd-transport mpi) world rank 0 is attention rank 0: it serves HTTP and\n"
                  "forwards requests to the other attention ranks; every rank is started with the same flags:\n"
                  "  mpirun -np 2 genbridge serve --afd 2A1F --afd-transport mpi --role attention ...\n"
                  "       : -np 1 genbridge serve --afd 2A1F --afd-transport mpi --role ffn ...\n"
                  "Send SIGTERM to world rank 0 to drain and end every rank. Every --afd-* flag needs --afd",
                  "none (monolithic)");
  add_choice_flag(srv, "--afd-connector", &so.run.afd_connector, {"sync", "async"},
                  "sync (control plane) | async (self-describing messages; attention ranks step independently)");
  add_int_flag(srv, "--afd-stages", &so.run.afd_stages, 1, genbridge::afd::kMaxStages, "Micro-batch stages per step");
  add_choice_flag(srv, "--afd-transport", &so.run.afd_transport, {"inproc", "mpi"},
                  "inproc (threads of this process) | mpi (every rank a `genbridge serve` process under mpirun)");
  add_real_flag(srv, "--afd-timeout", &so.run.afd_timeout_s, 0.001, 86400, false,
                "Deadline in seconds for every AFD wait. An idle attention rank sends an empty step every quarter\n"
                "of it (keep-alive), so idle periods of any length are fine; a rank silent for longer ends the job.\n"
                "A pause of this whole process (SIGSTOP) does not count (docs/afd.md)",
                "a number of seconds");
  add_afd_link_flags(srv, so.run);
  add_afd_placement_flags(srv, so.run);
  add_choice_flag(srv, "--role", &so.role, {"attention", "ffn"},
                  "This process's role under mpirun (MPMD launch). Default: from rank order (world rank 0 attention)");
  srv->footer(
      "Exit status: 0 stopped by SIGTERM or SIGINT; 1 the model, the listener or the AFD job failed (a failed\n"
      "or killed rank ends the server; under mpirun the job is aborted); 2 the command line is invalid.");
  return srv;
}

// `make-model`'s flags: a synthetic checkpoint's preset, seed, shards, vocabulary, tokenizer and weight format.
void add_make_model_flags(CLI::App* make, genbridge::tools::MakeModelOptions& mo) {
  add_choice_flag(make, "--preset", &mo.preset, genbridge::model::synthetic_preset_names(), "Model preset");
  add_uint64_flag(make, "--seed", &mo.seed, "Weight seed");
  add_int_flag(make, "--shards", &mo.shards, 1, 64, "Number of safetensors shards (> 1 writes an index)");
  add_real_flag(make, "--router-skew", &mo.router_skew, 0, genbridge::model::kMaxRouterSkew, false,
                "Bias every MoE layer's routing toward a few experts: the expert of rank r (a seeded order per\n"
                "layer) gets about S / (r + 1) added to its router logit, so the load is skewed as in served\n"
                "models (for measuring expert load balancing). 0 = the preset's routing");
  add_int64_flag(make, "--vocab-size", &mo.vocab_size, 0, std::numeric_limits<int32_t>::max(),
                 "Vocabulary size instead of the preset's (0: the preset's), e.g. 151936 for Qwen3's");
  add_string_flag(make, "--tokenizer", &mo.tokenizer_dir,
                  "Copy tokenizer.json and tokenizer_config.json from this directory instead of writing the synthetic\n"
                  "tokenizer (its ids must fit the vocabulary), e.g. a real Qwen3 tokenizer",
                  "the synthetic tokenizer of the vocabulary");
  add_choice_flag(make, "--weight-quant", &mo.weight_quant, {"none", "fp8"},
                  "fp8: write every attention, MLP and expert projection (DeepSeek: q_a/q_b or q, kv_a, kv_b, o,\n"
                  "indexer wq_b/wk) as a Hugging Face FP8 block-scaled checkpoint (F8_E4M3 + weight_scale_inv per\n"
                  "128 x 128 block; router, indexer weights_proj, embeddings, norms, LM head stay bf16; one shard).\n"
                  "DeepSeek-V4 presets: DeepSeek's form, FP8 attention / indexer wq_b / shared-expert linears (E8M0\n"
                  "'.scale' per 128 x 128 block) and MXFP4 routed experts (E8M0 per 32)");
  add_string_flag(make, "OUT_DIR", &mo.out_dir, "Directory to write (created if needed)")->required();
  make->footer("Exit status: 0 written; 1 writing failed; 2 the command line is invalid.");
}

}  // namespace

int main(int argc, char** argv) {
  using genbridge::tools::kExitFailed;
  using genbridge::tools::kExitUsage;
  using genbridge::tools::MakeModelOptions;
  using genbridge::tools::RunOptions;
  CLI::App app{
      "genbridge: Mixture-of-Experts decoding with stable operator contracts per accelerator generation.\n"
      "Subcommands: run (decode a batch; the main job), serve (OpenAI-compatible HTTP server), afd-worker (one\n"
      "process of an mpirun AFD job), make-model (write a synthetic checkpoint), info (what this build was made for).\n"
      "`genbridge <subcommand> --help` explains each flag."};
  app.require_subcommand(1);

  RunOptions ro;
  CLI::App* run = app.add_subcommand(
      "run",
      "Decode a batch of prompts and print the generated token ids and a metrics table. With no arguments it\n"
      "builds (once, cached) the synthetic 'small' model and decodes 8 prompts of 32 tokens, 32 new tokens each.");
  add_run_options(run, ro);
  run->footer(kExitCodes);

  RunOptions wo;
  wo.afd_transport = "mpi";
  std::string worker_role;
  CLI::App* worker = app.add_subcommand(
      "afd-worker",
      "One process of an attention-FFN disaggregated job under mpirun (Open MPI transport). Every process of\n"
      "the job runs it with the same flags as `run --afd`, e.g.\n"
      "  mpirun -np 2 genbridge afd-worker --role attention --afd 2A1F : -np 1 genbridge afd-worker --role ffn --afd "
      "2A1F\n"
      "or without --role (world ranks 0..A-1 attention, the rest FFN). Request r goes to attention rank r % A;\n"
      "world rank 0 writes the output files and prints every result in request order, the metrics and the\n"
      "AFD report. --afd is required; --afd-transport is mpi.");
  add_run_options(worker, wo);
  add_choice_flag(worker, "--role", &worker_role, {"attention", "ffn"},
                  "This process's role (MPMD launch). Default: from rank order (world ranks 0..A-1 attention)");
  worker->footer(std::string(kExitCodes) +
                 "\nUnder mpirun, world rank 0 returns the job's code; a failed rank ends the whole job.");

  genbridge::tools::ServeOptions so;
  CLI::App* srv = add_serve_command(&app, so);

  MakeModelOptions mo;
  CLI::App* make = app.add_subcommand(
      "make-model",
      "Write a synthetic Qwen3-MoE or DeepSeek-V3/V3.2 checkpoint (config.json + safetensors) with fixed-seed\n"
      "weights, and a tokenizer.json + tokenizer_config.json (byte-level BPE, ChatML template) of its vocabulary "
      "size.");
  add_make_model_flags(make, mo);

  std::string info_soc;
  CLI::App* info =
      app.add_subcommand("info", "Print the build's provider target, SoC, module manifest and device contract.");
  add_string_flag(info, "--soc", &info_soc,
                  "Validate this SoC selector against the build (nothing is printed when it does not match)",
                  "GENBRIDGE_SOC, else none");
  info->footer("Exit status: 0 printed; 1 the SoC does not match this build; 2 the command line is invalid.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help
  } catch (const CLI::ParseError& e) {
    std::string prefix = "genbridge";
    for (const CLI::App* sub : app.get_subcommands()) prefix += " " + sub->get_name();
    fmt::print(stderr, "{}: {}\nRun with --help for more information.\n", prefix, e.what());
    return kExitUsage;
  }
  ro.given = given_flags(run);
  so.run.given = given_flags(srv);
  wo.given = given_flags(worker);
  int code = kExitUsage;
  try {
    if (*run) code = genbridge::tools::run(ro);
    if (*worker) code = genbridge::tools::afd_worker(wo, worker_role);
    if (*make) code = genbridge::tools::make_model(mo);
    if (*srv) code = genbridge::tools::serve(so);
    if (*info) code = genbridge::tools::info(info_soc);
  } catch (const std::exception& e) {
    fmt::print(stderr, "genbridge: error: {}\n", e.what());
    return kExitFailed;
  }
  // Results go to stdout: a full disk or a closed pipe there is a failure, not a success.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "genbridge: writing to standard output failed: {}\n", std::strerror(errno));
    return kExitFailed;
  }
  return code;
}
