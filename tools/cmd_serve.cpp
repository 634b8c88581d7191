// genbridge serve: an OpenAI-compatible HTTP server over the continuous-batching engine.
//   check the flags -> device -> model (+ tokenizer.json, tokenizer_config.json) -> KV pool -> engine thread
//   -> HTTP listener -> (SIGTERM / SIGINT) drain: new requests 503, in-flight ones finish until
//   --shutdown-timeout, the rest are cancelled -> close the listener -> exit 0.
// With --afd the engine thread is an AFD job instead (afd/serve_job.h): in-process, every rank a thread
// of this process and each attention rank an engine the service feeds; under mpirun (--afd-transport mpi),
// this process is attention rank 0 (world rank 0: it serves HTTP and relays the requests of the other
// attention ranks), another attention rank or an FFN rank (no HTTP; they serve until attention rank 0
// finishes). The listener opens once the job is up (every rank agreed on the job
// and every attention rank's engine serves), so a job its ranks refuse (e.g. another --model or
// --weight-quant on one rank) exits before any client saw /health 200. A job that fails later ends the
// server: in-flight requests are answered with the error, the listener closes and the process exits 1
// (under mpirun the job is aborted).
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "afd/job.h"
#include "afd/serve_job.h"
#include "afd/transport.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/runner.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "tools/commands.h"
#include "tools/fingerprint.h"
#include "tools/flags.h"
#include "tools/run_support.h"
#include "tools/serve/generation_config.h"
#include "tools/serve/http_server.h"
#include "tools/serve/service.h"
#include "tools/serve/structured_output.h"
#include "tools/serve_afd.h"

namespace genbridge::tools {
namespace {

Status write_port_file(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << port << "\n";
    if (!f.flush()) return invalid_argument(fmt::format("--port-file {}: cannot write", path));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return invalid_argument(fmt::format("--port-file {}: cannot write: {}", path, ec.message()));
  return ok_status();
}

RunMode serve_mode(const RunOptions& o) {
  if (o.afd.empty()) return RunMode::kMonolithic;
  return o.afd_transport == "mpi" ? RunMode::kAfdMpi : RunMode::kAfdInproc;
}

// The rules of serve's own AFD flags (check_run_flags has checked the rest).
Status check_serve_afd_flags(const ServeOptions& so, RunMode mode) {
  if (so.http_threads == 0) {
    int64_t ranks = 1;
    if (mode != RunMode::kMonolithic) {
      GB_ASSIGN_OR_RETURN(const afd::AfdConfig cfg, afd_config_from(so.run, mode));
      ranks = cfg.num_attention;
    }
    const int64_t threads = int64_t{so.run.max_batch} * ranks + so.max_queued_requests + 8;
    if (threads > kMaxHttpThreads) {
      return invalid_argument(fmt::format(
          "--max-batch {}{} + --max-queued-requests {} + 8 = {} HTTP threads (the default of --http-threads: one per "
          "running or waiting request) is more than {}; lower --max-queued-requests or --max-batch, or give "
          "--http-threads in [1, {}] (connections beyond it wait for a thread)",
          so.run.max_batch, ranks > 1 ? fmt::format(" x {} attention ranks", ranks) : "", so.max_queued_requests,
          threads, kMaxHttpThreads, kMaxHttpThreads));
    }
  }
  if (!so.role.empty() && mode != RunMode::kAfdMpi) {
    return invalid_argument(
        fmt::format("--role {} applies under mpirun only (--afd-transport mpi); drop --role", so.role));
  }
  return ok_status();
}

// Under mpirun with several attention ranks, world rank 0 serves HTTP and relays the others' requests, so
// it must be an attention rank (known before MPI starts: its --role, or rank order).
Status check_http_rank(const ServeOptions& so, const afd::AfdConfig& cfg, int declared_role) {
  if (cfg.num_attention == 1 || afd::launcher_world_rank() != 0 ||
      !afd::launcher_says_ffn(declared_role, cfg.num_attention)) {
    return ok_status();
  }
  return invalid_argument(fmt::format(
      "--afd {} --afd-transport mpi: world rank 0 serves HTTP and relays the other attention ranks' requests, so it "
      "must be an attention rank, but it was started with --role ffn; list the attention ranks first (mpirun -np {} "
      "genbridge serve --role attention ... : -np {} genbridge serve --role ffn ...)",
      so.run.afd, cfg.num_attention, cfg.num_ffn));
}

// How this process serves: the mode, the AFD settings and this rank's declared role (--role).
struct ServeSetup {
  RunMode mode = RunMode::kMonolithic;
  bool afd_mode = false, mpi = false;
  std::optional<afd::AfdConfig> afd;
  int declared = afd::kRoleUndeclared;
  int attention_ranks() const { return afd_mode ? afd->num_attention : 1; }
  // Attention ranks whose engines run in this process (under mpirun, attention rank 0's alone: the others'
  // engines are up once the relay heard from each of them, before attention rank 0 serves).
  int local_attention_ranks() const { return mpi ? 1 : attention_ranks(); }
};

// The KV pool of each of `pools` attention ranks in this process: --kv-memory-mb, or room for --max-batch
// sequences of the whole context; when that room would take more than half of this machine's memory in all
// (e.g. --afd 2A1F on a 32k-context model), half the memory split over the pools instead (requests then wait
// for pages; the plan's note says so). Every process of an mpirun job computes the same number from the same
// flags.
engine::AssemblyOptions serve_assembly(const RunOptions& o, int pools, const model::QuantizedWeights* quantized) {
  return assembly_options(o, kv_pool_options(o, 1, pools, o.max_batch), quantized);
}

// A rank of an mpirun serving job other than world rank 0: no HTTP. An FFN rank serves its experts, another
// attention rank the requests attention rank 0 relays to it, until attention rank 0 finishes.
int serve_job_rank(const ServeOptions& so, int declared_role, afd::Role role) {
  const RunOptions& o = so.run;
  const Reporter report{"serve"};
  int code = kExitOk;
  // An FFN rank reads the expert weights only.
  const std::unique_ptr<StartedModel> m = start_model(
      o, {.mode = RunMode::kAfdMpi, .log = false, .build_model = false, .populate = role == afd::Role::kAttention},
      report, &code);
  if (!m) return code;
  const model::ModelConfig& mc = m->ckpt.config();
  if (Status s = check_run_flags_against_model(o, RunMode::kAfdMpi, mc); !s.ok()) return report.usage(s);
  const engine::AssemblyOptions assembly = serve_assembly(o, 1, nullptr);
  auto plan = engine::plan_kv_pool(assembly.kv_pool, m->dev, mc, {});  // the same number as the attention rank's
  if (!plan.ok()) return report.fail(plan.status());
  auto fp = serve_fingerprint(o, m->ckpt);
  if (!fp.ok()) return report.fail(fp.status());
  afd::ServeJobOptions jo{.afd = afd_config_from(o, RunMode::kAfdMpi).value(),
                          .engine = assembly.engine,
                          .fingerprint = std::move(fp).value(),
                          .expert_load = expert_load_from(o).value()};  // checked above
  // No serving function: a relayed attention rank runs what attention rank 0 sends (afd/serve_job.h).
  const Status s = afd::run_mpi_serve_rank(m->ckpt, m->dev, plan->pages, jo, declared_role, {});
  if (!s.ok()) return report.fail(s);
  return kExitOk;
}

// What the HTTP side serves and the engines behind it, built before the listener opens.
struct Backend {
  std::unique_ptr<StartedModel> model;
  std::optional<text::Tokenizer> tokenizer;
  std::optional<text::TokenizerConfig> tok_config;
  engine::AssemblyOptions assembly;
  engine::KvPoolPlan pool;
  serve::ServedModel served;
  std::unique_ptr<engine::AssembledEngine> engine;  // monolithic: the engine the service's thread drives
  // --afd: the job, run by its own thread; every attention rank's engine is a worker of the service.
  afd::ServeJobOptions job_options;
  afd::ServeLiveMetrics live;
  std::optional<serve::GenerationService> service;
};

// serve's model: tokenizer.json (required), tokenizer_config.json and chat_template.jinja (optional) of the model
// directory.
int load_tokenizer(const std::filesystem::path& dir, const Reporter& report, Backend* b, std::string* log_lines) {
  if (Status s = check_model_has_tokenizer(dir); !s.ok()) return report.usage(s);
  auto tokenizer = text::Tokenizer::load(dir / "tokenizer.json");
  if (!tokenizer.ok()) return report.fail(tokenizer.status());
  b->tokenizer = std::move(tokenizer).value();
  if (std::filesystem::exists(dir / text::kTokenizerConfigFile) ||
      std::filesystem::exists(dir / text::kChatTemplateFile)) {
    auto c = text::TokenizerConfig::load(dir);
    if (!c.ok()) return report.fail(c.status());
    b->tok_config = std::move(c).value();
  }
  *log_lines = b->tokenizer->describe() + "\n";
  return kExitOk;
}

// --chat-template: a file, or the template itself; replaces every template of the model directory.
Status apply_chat_template_flag(const std::string& value, Backend* b) {
  std::error_code ec;
  std::string source;
  if (std::filesystem::is_regular_file(value, ec)) {
    std::ifstream in(value, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) return invalid_argument(fmt::format("--chat-template {}: cannot read the file", value));
    source = text.str();
  } else if (value.find("{{") != std::string::npos || value.find("{%") != std::string::npos) {
    source = value;
  } else {
    return invalid_argument(fmt::format(
        "--chat-template {}: no such file, and not a template either (a template holds '{{{{' or '{{%')", value));
  }
  auto t = text::ChatTemplate::parse(source);
  if (!t.ok()) return invalid_argument(fmt::format("--chat-template: {}", t.status().message()));
  if (!b->tok_config) b->tok_config.emplace();
  b->tok_config->chat_template = std::move(t).value();
  b->tok_config->named_templates.clear();
  return ok_status();
}

// --allowed-origins: each value an origin or "*", or a JSON list of them (vLLM's form).
Result<std::vector<std::string>> allowed_origins(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    if (v.front() != '[') {
      out.push_back(v);
      continue;
    }
    const nlohmann::json list = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
    if (!list.is_array() || list.empty() ||
        !std::all_of(list.begin(), list.end(), [](const nlohmann::json& o) { return o.is_string() && o != ""; })) {
      return invalid_argument(fmt::format("--allowed-origins {}: a JSON list must hold origins (strings)", v));
    }
    for (const auto& o : list) out.push_back(o.get<std::string>());
  }
  return out;
}

// The model as the HTTP side names and checks it: its names, its end-of-generation tokens and sampling defaults
// (generation_config.json, --override-generation-config), its chat template (--chat-template) and fingerprint.
Result<serve::ServedModel> served_model(const ServeOptions& so, Backend& b) {
  const model::ModelConfig& mc = b.model->ckpt.config();
  const std::filesystem::path dir = std::filesystem::absolute(b.model->dir).lexically_normal();
  serve::ServedModel served;
  served.names = so.served_model_names;
  if (served.names.empty()) {
    served.names.push_back(dir.filename().string());
    if (served.names[0].empty()) served.names[0] = dir.parent_path().filename().string();
  }
  if (!so.chat_template.empty()) GB_RETURN_IF_ERROR(apply_chat_template_flag(so.chat_template, &b));
  served.tokenizer = &*b.tokenizer;
  served.tokenizer_config = b.tok_config ? &*b.tok_config : nullptr;
  const auto add_eos = [&](int32_t id, const std::string& from) -> Status {
    if (id >= mc.vocab_size) {
      return invalid_argument(fmt::format("{}: end-of-generation token {} is outside the model's vocabulary [0, {})",
                                          from, id, mc.vocab_size));
    }
    if (std::find(served.eos_tokens.begin(), served.eos_tokens.end(), id) == served.eos_tokens.end()) {
      served.eos_tokens.push_back(id);
    }
    return ok_status();
  };
  if (b.tok_config && b.tok_config->eos_token) {
    if (auto id = b.tokenizer->token_to_id(*b.tok_config->eos_token); id && *id < mc.vocab_size) {
      served.eos_tokens.push_back(*id);
    }
  }
  // --generation-config: auto (the model directory's file), vllm (none), or a directory.
  serve::GenerationConfig gc;
  if (so.generation_config != "vllm") {
    const std::filesystem::path from =
        so.generation_config == "auto" ? b.model->dir : std::filesystem::path(so.generation_config);
    if (so.generation_config != "auto" && !std::filesystem::is_directory(from)) {
      return invalid_argument(fmt::format(
          "--generation-config {}: expected auto, vllm or a directory holding generation_config.json", from.string()));
    }
    GB_ASSIGN_OR_RETURN(gc, serve::read_generation_config(from));
    for (int32_t id : gc.eos_token_ids) GB_RETURN_IF_ERROR(add_eos(id, gc.source));
  }
  served.defaults = gc.defaults;
  if (!so.override_generation_config.empty()) {
    GB_RETURN_IF_ERROR(serve::override_generation_config(so.override_generation_config, "--override-generation-config",
                                                         &served.defaults));
  }
  if (so.run.given.count("--default-max-tokens")) served.defaults.max_tokens.reset();  // the flag wins
  if (!so.run.quiet) {
    gc.defaults = served.defaults;
    std::string eos;
    for (int32_t id : served.eos_tokens) eos += (eos.empty() ? "" : ", ") + std::to_string(id);
    fmt::print(stderr, "generation config ({}): end-of-generation tokens [{}]; {}\n",
               gc.source.empty() ? so.generation_config == "vllm" ? "--generation-config vllm" : "none" : gc.source,
               eos, serve::describe_generation_config(gc));
  }
  if (so.reasoning_parser == "qwen3") served.reasoning_parser = serve::ReasoningParser::kQwen3;
  if (so.reasoning_parser == "deepseek_r1") served.reasoning_parser = serve::ReasoningParser::kDeepSeekR1;
  // system_fingerprint: the build, the weights and every flag that shapes the outputs (serve's job fingerprint),
  // and the chat template and sampling defaults in force.
  GB_ASSIGN_OR_RETURN(const std::vector<afd::FingerprintItem> items, serve_fingerprint(so.run, b.model->ckpt));
  std::string all = so.chat_template + "\n" + so.override_generation_config + "\n" + gc.source + "\n";
  for (const afd::FingerprintItem& item : items) all += item.name + "=" + item.value + "\n";
  served.system_fingerprint = "fp_" + afd::fingerprint_digest(all).substr(0, 10);
  served.vocab_size = mc.vocab_size;
  served.max_position_embeddings = mc.max_position_embeddings;
  served.kv_pages = b.pool.pages;
  served.kv_page_size = b.pool.geometry.page_size;
  served.kv_memory_mb = b.assembly.kv_pool.memory_mb;
  served.default_max_tokens = so.default_max_tokens;
  served.max_sequences = so.max_queued_requests;
  served.priority_scheduling = so.run.scheduling_policy == "priority";
  // Tool calls and structured outputs: the vocabulary's trie, and the tool-call format of the template in force
  // (--chat-template applied above).
  served.structured = std::make_shared<serve::StructuredSupport>(*b.tokenizer, served.tokenizer_config, mc.vocab_size);
  return served;
}

// The start-up (run's, with the tokenizer), the pool and what is served. The exit code; kExitOk to go on.
int load_backend(const ServeOptions& so, const ServeSetup& setup, const Reporter& report, Backend* b) {
  const RunOptions& o = so.run;
  int code = kExitOk;
  const StartOptions start{.mode = setup.mode,
                           .log = !o.quiet,
                           .build_model = !setup.mpi,
                           .at_model_dir = [&](const std::filesystem::path& dir, std::string* lines) {
                             return load_tokenizer(dir, report, b, lines);
                           }};
  b->model = start_model(o, start, report, &code);
  if (!b->model) return code;
  const model::ModelConfig& mc = b->model->ckpt.config();
  if (setup.afd_mode) {
    if (Status s = check_run_flags_against_model(o, setup.mode, mc); !s.ok()) return report.usage(s);
  } else if (Status s = check_engine_flags_against_model(o, mc); !s.ok()) {
    return report.usage(s);
  }
  // Each attention rank's pool with --afd (every one in this process, in-process).
  b->assembly =
      serve_assembly(o, setup.afd_mode && !setup.mpi ? setup.afd->num_attention : 1, b->model->quantized.get());
  auto plan = engine::plan_kv_pool(b->assembly.kv_pool, b->model->dev, mc, {});
  if (!plan.ok()) return report.usage(plan.status());
  b->pool = std::move(plan).value();
  if (!o.quiet && !b->pool.note.empty()) fmt::print(stderr, "{}\n", b->pool.note);
  if (!o.quiet) {
    fmt::print(stderr, "{}\n", engine::describe_kv_pool(b->pool, b->model->dev, mc, setup.afd_mode));
  }
  auto served = served_model(so, *b);
  if (!served.ok()) return report.usage(served.status());
  b->served = std::move(served).value();
  return kExitOk;
}

// --afd: the job's options and the service whose workers are the attention ranks' engines.
Status build_afd_service(const ServeOptions& so, const ServeSetup& setup, serve::ServiceOptions service_options,
                         Backend* b) {
  const RunOptions& o = so.run;
  const afd::AfdConfig& cfg = *setup.afd;
  b->job_options.afd = cfg;
  b->job_options.engine = b->assembly.engine;
  b->job_options.live = &b->live;
  b->job_options.quantized = b->assembly.quantized;
  GB_ASSIGN_OR_RETURN(b->job_options.expert_load, expert_load_from(o));
  if (!o.quiet) {
    b->job_options.on_weight_lines = [](const std::vector<std::string>& lines) {
      std::string text = "weights quantized per rank at load:";
      for (const std::string& l : lines) text += "\n  " + l;
      fmt::print(stderr, "{}\n", text);
    };
  }
  if (setup.mpi) {
    GB_ASSIGN_OR_RETURN(b->job_options.fingerprint, serve_fingerprint(o, b->model->ckpt));
  }
  service_options.max_prompt_tokens = afd::max_prompt_tokens(b->job_options);
  service_options.max_prompt_why = "--afd: a prompt is prefilled in one step, which must fit the AFD transfer buffers";
  const std::string ranks = fmt::format(
      "# HELP genbridge_afd_ranks Ranks of the AFD job.\n# TYPE genbridge_afd_ranks gauge\n"
      "genbridge_afd_ranks{{role=\"attention\"}} {}\ngenbridge_afd_ranks{{role=\"ffn\"}} {}\n",
      cfg.num_attention, cfg.num_ffn);
  service_options.extra_metrics = [live = &b->live, ranks, mpi = setup.mpi] {
    return ranks + live->prometheus(/*ffn_here=*/!mpi);
  };
  b->service.emplace(serve::WorkerPools{.workers = cfg.num_attention,
                                        .local_workers = setup.local_attention_ranks(),
                                        .pages_per_worker = b->pool.pages,
                                        .bytes_per_page = b->pool.geometry.bytes_per_page(),
                                        .state_slots_per_worker = b->pool.state_slots,
                                        .bytes_per_state_slot = b->pool.geometry.state.bytes_per_slot(),
                                        .state_contents = b->pool.geometry.state.contents},
                     service_options);
  if (!o.quiet) {
    fmt::print(stderr,
               "AFD {}: {} attention + {} FFN ranks ({}), {} connector, {} stage(s){}; a request goes to the "
               "attention rank with the fewest unfinished requests; keep-alive every {} ms while idle\n",
               o.afd, cfg.num_attention, cfg.num_ffn,
               setup.mpi ? "mpi: this process is attention rank 0" : "in-process",
               afd::connector_kind_name(cfg.connector), cfg.num_stages, describe_redundant_experts(o),
               afd::keep_alive_ms(cfg));
  }
  return ok_status();
}

// The service: monolithic, over the one engine assembled here; --afd, fed to the job's attention ranks.
Status build_service(const ServeOptions& so, const ServeSetup& setup, Backend* b) {
  const serve::ServiceOptions service_options{
      .max_batch = so.run.max_batch,
      .max_queued_requests = so.max_queued_requests,
      .route_by_first_tokens = so.run.enable_prefix_caching ? b->pool.geometry.page_size : 0};
  if (setup.afd_mode) return build_afd_service(so, setup, service_options, b);
  GB_ASSIGN_OR_RETURN(b->engine, engine::assemble_engine(b->model->ckpt, b->model->dev, b->pool.pages, b->assembly));
  b->service.emplace(*b->engine->engine, b->engine->pool, service_options);
  return ok_status();
}

// The running server: the listener, the AFD job's thread and the signal thread, and how they end.
class ServeLoop {
 public:
  ServeLoop(const ServeOptions& so, const ServeSetup& setup, Backend& b, serve::HttpServer& http,
            const sigset_t& signals)
      : so_(so),
        setup_(setup),
        b_(b),
        service_(*b.service),
        http_(http),
        signals_(signals),
        job_bound_(setup.afd_mode ? 4 * setup.afd->timeout_ms + 60'000 : 0) {}
  // Listens on the bound `port` until a signal drains the server or the job fails. The exit code.
  int run(int port);

 private:
  void start_job();
  void exit_if_mpi_job_failed();
  bool wait_job();
  void close_listener(serve::Clock::time_point replies_by);
  void signal_loop();
  // Ends what started before the listener opened (a failed port file, or the job ending first).
  void stop_before_listening();

  const ServeOptions& so_;
  const ServeSetup& setup_;
  Backend& b_;
  serve::GenerationService& service_;
  serve::HttpServer& http_;
  const sigset_t& signals_;
  const std::chrono::milliseconds job_bound_;  // the AFD job ends within its deadlines once the service stops
  std::atomic<bool> job_done_{false};
  std::atomic<int> workers_up_{0};  // attention ranks whose engine serves (the job is up when all of them do)
  Status job_status_;
  std::thread job_thread_;
  std::atomic<bool> listener_done_{false};
  std::thread signal_thread_;
};

void ServeLoop::start_job() {
  if (!setup_.afd_mode) {
    service_.start();
    return;
  }
  const afd::AttentionServeFn worker = service_worker_fn(service_);
  const afd::AttentionServeFn serve_fn = [this, worker](int a, engine::Engine& eng, runtime::KvPagePool& pool,
                                                        afd::AttentionIdle& idle, afd::RelayHub* relay) {
    ++workers_up_;
    return worker(a, eng, pool, idle, relay);
  };
  job_thread_ = std::thread([this, serve_fn] {
    const StartedModel& m = *b_.model;
    Status s = setup_.mpi
                   ? afd::run_mpi_serve_rank(m.ckpt, m.dev, b_.pool.pages, b_.job_options, setup_.declared, serve_fn)
                   : afd::run_inproc_serve_job(m.ckpt, m.dev, b_.pool.pages, b_.job_options, serve_fn);
    if (!s.ok()) service_.fail(s.to_string());
    job_status_ = std::move(s);
    job_done_ = true;
  });
}

// Under mpirun a failed job does not return here (MPI_Abort), and mpirun, seeing a rank die or abort, sends
// this process SIGTERM (which the signal thread takes) and SIGKILL a second later: once the service has
// failed, this process answers the requests in flight with the error and exits 1 itself.
void ServeLoop::exit_if_mpi_job_failed() {
  if (!setup_.mpi || !service_.failed()) return;
  service_.wait_streams_released(serve::Clock::now() + std::chrono::seconds(5));
  fmt::print(stderr, "genbridge serve: the AFD job failed: {}\n", service_.failure());
  std::fflush(stderr);
  std::_Exit(kExitFailed);
}

bool ServeLoop::wait_job() {
  const auto deadline = serve::Clock::now() + job_bound_;
  while (setup_.afd_mode && !job_done_.load() && serve::Clock::now() < deadline) {
    exit_if_mpi_job_failed();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return !setup_.afd_mode || job_done_.load();
}

// Closes the listener once every reply still being written is done (or `replies_by` passes): closing it ends them
// (cpp-httplib stops their content providers), e.g. a drained stream's last events or a failed job's error event.
// stop() before listen() started is lost, so it is repeated until listen() returns.
void ServeLoop::close_listener(serve::Clock::time_point replies_by) {
  service_.wait_streams_released(replies_by);
  const auto deadline = serve::Clock::now() + std::chrono::seconds(30);
  while (!listener_done_.load()) {
    http_.stop();
    if (serve::Clock::now() > deadline) {
      fmt::print(stderr, "genbridge serve: the listener did not close within 30 s\n");
      std::_Exit(kExitFailed);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ServeLoop::signal_loop() {
  const timespec slice{0, 100'000'000};
  while (!listener_done_.load()) {
    exit_if_mpi_job_failed();
    if (job_done_.load() && !job_status_.ok()) {
      fmt::print(stderr,
                 "genbridge serve: the AFD job failed; answering in-flight requests and closing the listener\n");
      close_listener(serve::Clock::now() + std::chrono::seconds(5));
      return;
    }
    const int sig = sigtimedwait(&signals_, nullptr, &slice);
    if (sig < 0) continue;  // EAGAIN (no signal in this slice) or EINTR
    fmt::print(stderr, "genbridge serve: {}: draining {} in-flight request(s) (--shutdown-timeout {} s) ...\n",
               sig == SIGTERM ? "SIGTERM" : "SIGINT", service_.in_flight(), so_.shutdown_timeout_s);
    const auto deadline = serve::Clock::now() + std::chrono::duration_cast<serve::Clock::duration>(
                                                    std::chrono::duration<double>(so_.shutdown_timeout_s));
    const int64_t aborted = service_.shutdown(deadline);
    fmt::print(stderr, "genbridge serve: {} request(s) cancelled at the deadline; closing the listener\n", aborted);
    if (!wait_job()) fmt::print(stderr, "genbridge serve: the AFD job did not end after the drain\n");
    close_listener(std::max(deadline, serve::Clock::now() + std::chrono::seconds(5)));
    return;
  }
}

int ServeLoop::run(int port) {
  start_job();
  signal_thread_ = std::thread([this] { signal_loop(); });
  // --afd: the listener opens once the job is up. Until then a client's connection waits in the listen backlog
  // (unanswered); when the job ends first (refused at init, or stopped by a signal) this process exits
  // without having answered anything. The wait is bounded by the job's own init deadlines.
  if (setup_.afd_mode) {
    if (!so_.run.quiet) fmt::print(stderr, "genbridge serve: waiting for the AFD job to start before listening\n");
    while (workers_up_.load() < setup_.local_attention_ranks() && !job_done_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (workers_up_.load() < setup_.local_attention_ranks()) {
      listener_done_ = true;
      signal_thread_.join();
      job_thread_.join();
      if (!job_status_.ok()) return Reporter{"serve"}.fail(job_status_);
      fmt::print(stderr, "genbridge serve: stopped before listening\n");
      return kExitOk;
    }
  }
  if (!so_.port_file.empty()) {
    if (Status s = write_port_file(so_.port_file, port); !s.ok()) {
      fmt::print(stderr, "genbridge serve: {}\n", s.message());
      stop_before_listening();
      return kExitFailed;
    }
  }
  fmt::print(stderr, "genbridge serve: listening on http://{}:{} (model '{}', {} KV pages of {} tokens{})\n", so_.host,
             port, b_.served.name(), b_.pool.pages, b_.pool.geometry.page_size,
             setup_.afd_mode ? " per attention rank" : "");
  const Status listened = http_.listen();
  listener_done_ = true;
  signal_thread_.join();
  service_.shutdown(serve::Clock::now());
  if (job_thread_.joinable()) {
    if (!wait_job()) {
      fmt::print(stderr, "genbridge serve: the AFD job did not end within {} ms\n", job_bound_.count());
      std::_Exit(kExitFailed);
    }
    job_thread_.join();
  }
  if (!listened.ok()) return Reporter{"serve"}.fail(listened);
  if (!job_status_.ok()) return Reporter{"serve"}.fail(job_status_);
  fmt::print(stderr, "genbridge serve: stopped\n");
  return kExitOk;
}

void ServeLoop::stop_before_listening() {
  listener_done_ = true;
  signal_thread_.join();
  service_.shutdown(serve::Clock::now());
  if (job_thread_.joinable()) {
    if (!wait_job()) std::_Exit(kExitFailed);
    job_thread_.join();
  }
}

// The checks that need no model, in the order serve makes them. The exit code; kExitOk to go on.
int check_serve(const ServeOptions& so, const Reporter& report, ServeSetup* setup) {
  const RunOptions& o = so.run;
  setup->mode = serve_mode(o);
  setup->afd_mode = setup->mode != RunMode::kMonolithic;
  setup->mpi = setup->mode == RunMode::kAfdMpi;
  if (Status s = check_run_flags(o, setup->mode); !s.ok()) return report.usage(s);
  if (Status s = check_serve_afd_flags(so, setup->mode); !s.ok()) return report.usage(s);
  if (!so.role.empty()) {
    auto r = afd::parse_role(so.role);
    if (!r.ok()) return report.usage(r.status());
    setup->declared = *r;
  }
  if (setup->afd_mode) setup->afd = afd_config_from(o, setup->mode).value();  // checked above
  return kExitOk;
}

}  // namespace

int serve(const ServeOptions& so) {
  const Reporter report{"serve"};
  ServeSetup setup;
  if (const int code = check_serve(so, report, &setup); code != kExitOk) return code;
  if (setup.mpi) {
    // Open MPI names this process's world rank before MPI_Init; without --role ranks 0..A-1 are attention.
    if (Status s = check_http_rank(so, *setup.afd, setup.declared); !s.ok()) return report.usage(s);
    if (afd::launcher_says_ffn(setup.declared, setup.afd->num_attention)) {
      return serve_job_rank(so, setup.declared, afd::Role::kFfn);
    }
    // World rank 0 serves HTTP; another attention rank is relayed (not under mpirun: the transport says so).
    if (setup.afd->num_attention > 1 && afd::launcher_world_rank() > 0) {
      return serve_job_rank(so, setup.declared, afd::Role::kAttention);
    }
  }
  if (!so.port_file.empty()) {
    if (Status s = write_port_file(so.port_file + ".check", 0); !s.ok()) return report.usage(s);
    std::filesystem::remove(so.port_file + ".check");
  }
  // SIGTERM and SIGINT go to the signal thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that went away is a failed write, not a dead server
  serve::tune_allocator_for_serving();

  Backend b;
  if (const int code = load_backend(so, setup, report, &b); code != kExitOk) return code;
  if (Status s = build_service(so, setup, &b); !s.ok()) return report.fail(s);
  auto origins = allowed_origins(so.allowed_origins);
  if (!origins.ok()) return report.usage(origins.status());
  serve::HttpServer http(*b.service, b.served,
                         {.host = so.host,
                          .port = so.port,
                          .threads = so.http_threads,
                          .request_timeout_s = so.request_timeout_s,
                          .max_body_bytes = static_cast<size_t>(so.max_body_mb) << 20,
                          .api_keys = so.api_keys,
                          .allowed_origins = std::move(origins).value()},
                         so.run.max_batch * setup.attention_ranks() + so.max_queued_requests + 8);
  auto port = http.bind();
  if (!port.ok()) return report.fail(port.status());
  ServeLoop loop(so, setup, b, http, signals);
  return loop.run(*port);
}

}  // namespace genbridge::tools
