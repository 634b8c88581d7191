// genbridge serve: an OpenAI-compatible HTTP server over the continuous-batching engine.
//   check the flags -> device -> model (+ tokenizer.json, tokenizer_config.json) -> KV pool -> engine thread
//   -> HTTP listener -> (SIGTERM / SIGINT) drain: new requests 503, in-flight ones finish until
//   --shutdown-timeout, the rest are cancelled -> close the listener -> exit 0.
// With --afd the engine thread is an AFD job instead (afd/serve_job.h): in-process, every rank a thread
// of this process and each attention rank an engine the service feeds; under mpirun (--afd-transport mpi),
// this process is the attention rank (world rank 0: it serves HTTP) or an FFN rank (no HTTP; it serves
// until the attention rank finishes). The listener opens once the job is up (every rank agreed on the job
// and every attention rank's engine serves), so a job its ranks refuse (e.g. another --model or
// --weight-quant on one rank) exits before any client saw /health 200. A job that fails later ends the
// server: in-flight requests are answered with the error, the listener closes and the process exits 1
// (under mpirun the job is aborted).
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "afd/job.h"
#include "afd/serve_job.h"
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
#include "tools/serve/http_server.h"
#include "tools/serve/service.h"
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

// The KV pool of each of `pools` attention ranks in this process: --kv-memory-mb, or room for --max-batch
// sequences of the whole context; when that room would take more than half of this machine's memory in all
// (e.g. --afd 2A1F on a 32k-context model), half the memory split over the pools instead (requests then wait
// for pages), said on the log. Every process of an mpirun job computes the same number from the same flags.
Result<int64_t> serve_kv_pages(RunOptions o, const runtime::KvPageGeometry& geometry, int64_t max_position, int pools,
                               bool log) {
  std::vector<engine::Request> sizing(static_cast<size_t>(o.max_batch));
  for (auto& r : sizing) {
    r.prompt = {0};
    r.max_new_tokens = static_cast<int>(max_position);
  }
  const int64_t phys = physical_memory_bytes();
  if (o.kv_memory_mb == 0 && phys > 0) {
    const int64_t per_seq = geometry.pages_for(max_position) * geometry.bytes_per_page();
    const __int128 whole = static_cast<__int128>(per_seq) * o.max_batch * std::max(pools, 1);
    if (whole > phys / 2) {
      o.kv_memory_mb = std::max<int64_t>(1, (phys / 2 / std::max(pools, 1)) >> 20);
      if (log) {
        fmt::print(stderr,
                   "KV pool: room for --max-batch {} sequences of the whole context ({} tokens) would take {} MiB{}, "
                   "more than half of this machine's memory; using {} MiB{} (requests wait for pages; set "
                   "--kv-memory-mb to choose)\n",
                   o.max_batch, max_position, static_cast<int64_t>(whole >> 20), pools > 1 ? " in all" : "",
                   o.kv_memory_mb, pools > 1 ? fmt::format(" per attention rank ({})", pools) : "");
      }
    }
  }
  return kv_pool_pages(o, geometry, sizing, 1, pools);
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
  if (mode == RunMode::kAfdMpi) {
    GB_ASSIGN_OR_RETURN(const afd::AfdConfig cfg, afd_config_from(so.run, mode));
    if (cfg.num_attention != 1) {
      return invalid_argument(fmt::format(
          "--afd {} --afd-transport mpi: under mpirun one attention rank (world rank 0) serves HTTP, so A must be 1 "
          "(e.g. 1A{}F); for several attention ranks use the in-process transport",
          so.run.afd, cfg.num_ffn));
    }
  }
  return ok_status();
}

// An FFN rank of an mpirun serving job: no HTTP; serves its experts until the attention rank finishes.
int serve_ffn_rank(const ServeOptions& so, int declared_role) {
  const RunOptions& o = so.run;
  auto fail = [&](const Status& s) {
    fmt::print(stderr, "genbridge serve: {}\n", s.to_string());
    return kExitFailed;
  };
  if (o.threads > 0) set_num_threads(o.threads);
  auto dev = make_device(o);
  if (!dev.ok()) return fail(dev.status());
  auto dir = resolve_model_dir(o, /*build=*/false);
  if (!dir.ok()) return fail(dir.status());
  auto ckpt = open_checkpoint(*dir, o, /*populate=*/false);  // reads the expert weights only
  if (!ckpt.ok()) return fail(ckpt.status());
  const model::ModelConfig& mc = ckpt->config();
  if (Status s = check_run_flags_against_model(o, RunMode::kAfdMpi, mc); !s.ok()) {
    fmt::print(stderr, "genbridge serve: {}\n", s.message());
    return kExitUsage;
  }
  const runtime::KvPageGeometry geometry = dev->kv_page_geometry(model::kv_model_shape(mc));
  // The same number as the attention rank computes.
  auto pages = serve_kv_pages(o, geometry, mc.max_position_embeddings, 1, /*log=*/false);
  if (!pages.ok()) return fail(pages.status());
  auto fp = serve_fingerprint(o, *ckpt);
  if (!fp.ok()) return fail(fp.status());
  afd::ServeJobOptions jo{.afd = afd_config_from(o, RunMode::kAfdMpi).value(),
                          .engine = {.max_batch = o.max_batch},
                          .fingerprint = std::move(fp).value()};
  const Status s = afd::run_mpi_serve_rank(*ckpt, *dev, *pages, jo, declared_role, {});
  if (!s.ok()) return fail(s);
  return kExitOk;
}

}  // namespace

int serve(const ServeOptions& so) {
  RunOptions o = so.run;
  auto usage = [&](const Status& s) {
    fmt::print(stderr, "genbridge serve: {}\n", s.message());
    return kExitUsage;
  };
  auto fail = [&](const Status& s) {
    fmt::print(stderr, "genbridge serve: {}\n", s.to_string());
    return kExitFailed;
  };
  const RunMode mode = serve_mode(o);
  const bool afd_mode = mode != RunMode::kMonolithic, mpi = mode == RunMode::kAfdMpi;
  if (Status s = check_run_flags(o, mode); !s.ok()) return usage(s);
  if (Status s = check_serve_afd_flags(so, mode); !s.ok()) return usage(s);
  int declared = afd::kRoleUndeclared;
  if (!so.role.empty()) {
    auto r = afd::parse_role(so.role);
    if (!r.ok()) return usage(r.status());
    declared = *r;
  }
  std::optional<afd::AfdConfig> afd_cfg;
  if (afd_mode) afd_cfg = afd_config_from(o, mode).value();  // checked above
  if (mpi) {
    // Open MPI names this process's world rank before MPI_Init; without --role ranks 0..A-1 are attention.
    const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
    const bool ffn = declared == static_cast<int>(afd::Role::kFfn) ||
                     (declared == afd::kRoleUndeclared && world_rank && std::atoi(world_rank) >= afd_cfg->num_attention);
    if (ffn) return serve_ffn_rank(so, declared);
  }
  if (!so.port_file.empty()) {
    if (Status s = write_port_file(so.port_file + ".check", 0); !s.ok()) return usage(s);
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

  if (o.threads > 0) set_num_threads(o.threads);
  auto dev = make_device(o);
  if (!dev.ok()) return fail(dev.status());
  if (!o.quiet) fmt::print(stderr, "{}\n{}\n", dev->log_line(), cpu_target_line());
  auto dir = resolve_model_dir(o, /*build=*/!mpi);
  if (!dir.ok()) return fail(dir.status());
  if (Status s = check_model_has_tokenizer(*dir); !s.ok()) return usage(s);
  auto tokenizer = text::Tokenizer::load(*dir / "tokenizer.json");
  if (!tokenizer.ok()) return fail(tokenizer.status());
  std::optional<text::TokenizerConfig> tok_config;
  if (std::filesystem::exists(*dir / "tokenizer_config.json")) {
    auto c = text::TokenizerConfig::load(*dir / "tokenizer_config.json");
    if (!c.ok()) return fail(c.status());
    tok_config = std::move(c).value();
  }
  auto ckpt = open_checkpoint(*dir, o);
  if (!ckpt.ok()) return fail(ckpt.status());
  const model::ModelConfig& mc = ckpt->config();
  if (!o.quiet) fmt::print(stderr, "{}\n{}\n", describe_model(*ckpt), tokenizer->describe());
  // --weight-quant: quantized once here, before the listener opens; under mpirun each rank quantizes only its
  // share once it knows its role (afd::run_mpi_serve_rank) and this process prints every rank's line then.
  auto quantized = mpi ? Result<std::unique_ptr<model::QuantizedWeights>>(std::unique_ptr<model::QuantizedWeights>())
                       : quantize_weights(*ckpt, *dev, !o.quiet);
  if (!quantized.ok()) return fail(quantized.status());
  if (!o.quiet && !(mpi && dev->weight_quant())) fmt::print(stderr, "{}\n", describe_weights(*ckpt, quantized->get()));
  if (afd_mode) {
    if (Status s = check_run_flags_against_model(o, mode, mc); !s.ok()) return usage(s);
  }

  // The KV pool (each attention rank's with --afd): --kv-memory-mb, or room for --max-batch sequences of the
  // whole context.
  const runtime::KvPageGeometry geometry = dev->kv_page_geometry(model::kv_model_shape(mc));
  const int pools = afd_mode && !mpi ? afd_cfg->num_attention : 1;
  auto pages = serve_kv_pages(o, geometry, mc.max_position_embeddings, pools, !o.quiet);
  if (!pages.ok()) return usage(pages.status());

  serve::ServedModel served;
  served.name = so.served_model_name.empty() ? std::filesystem::absolute(*dir).lexically_normal().filename().string()
                                             : so.served_model_name;
  if (served.name.empty())
    served.name = std::filesystem::absolute(*dir).lexically_normal().parent_path().filename().string();
  served.tokenizer = &*tokenizer;
  served.tokenizer_config = tok_config ? &*tok_config : nullptr;
  if (tok_config && tok_config->eos_token) {
    if (auto id = tokenizer->token_to_id(*tok_config->eos_token); id && *id < mc.vocab_size) served.stop_tokens = {*id};
  }
  served.vocab_size = mc.vocab_size;
  served.max_position_embeddings = mc.max_position_embeddings;
  served.kv_pages = *pages;
  served.kv_page_size = geometry.page_size;
  served.kv_memory_mb = o.kv_memory_mb;
  served.default_max_tokens = so.default_max_tokens;

  serve::ServiceOptions service_options{.max_batch = o.max_batch, .max_queued_requests = so.max_queued_requests};
  // Monolithic: the engine and its thread.
  std::optional<runtime::KvPagePool> pool;
  std::unique_ptr<model::ModelRunner> runner;
  std::optional<engine::LocalExecutor> executor;
  // AFD: the job, run by its own thread; every attention rank's engine is a worker of the service.
  afd::ServeJobOptions job_options;
  afd::ServeLiveMetrics live;
  std::optional<serve::GenerationService> service;
  if (!afd_mode) {
    auto p = runtime::KvPagePool::create(geometry, *pages);
    if (!p.ok()) return fail(p.status());
    pool.emplace(std::move(p).value());
    auto r = model::ModelRunner::create(*ckpt, *dev, *pool, quantized->get());
    if (!r.ok()) return fail(r.status());
    runner = std::move(r).value();
    executor.emplace(*runner);
    service.emplace(*executor, *pool, service_options);
  } else {
    job_options.afd = *afd_cfg;
    job_options.engine = {.max_batch = o.max_batch};
    job_options.live = &live;
    job_options.quantized = quantized->get();
    if (!o.quiet) {
      job_options.on_weight_lines = [](const std::vector<std::string>& lines) {
        std::string text = "weights quantized per rank at load:";
        for (const std::string& l : lines) text += "\n  " + l;
        fmt::print(stderr, "{}\n", text);
      };
    }
    if (mpi) {
      auto fp = serve_fingerprint(o, *ckpt);
      if (!fp.ok()) return fail(fp.status());
      job_options.fingerprint = std::move(fp).value();
    }
    service_options.max_prompt_tokens = afd::max_prompt_tokens(job_options);
    service_options.max_prompt_why = "--afd: a prompt is prefilled in one step, which must fit the AFD transfer buffers";
    const std::string ranks = fmt::format(
        "# HELP genbridge_afd_ranks Ranks of the AFD job.\n# TYPE genbridge_afd_ranks gauge\n"
        "genbridge_afd_ranks{{role=\"attention\"}} {}\ngenbridge_afd_ranks{{role=\"ffn\"}} {}\n",
        afd_cfg->num_attention, afd_cfg->num_ffn);
    service_options.extra_metrics = [&live, ranks, mpi] { return ranks + live.prometheus(/*ffn_here=*/!mpi); };
    service.emplace(serve::WorkerPools{.workers = afd_cfg->num_attention,
                                       .pages_per_worker = *pages,
                                       .bytes_per_page = geometry.bytes_per_page()},
                    service_options);
    if (!o.quiet) {
      fmt::print(stderr,
                 "AFD {}: {} attention + {} FFN ranks ({}), {} connector, {} stage(s); a request goes to the attention "
                 "rank with the fewest unfinished requests; keep-alive every {} ms while idle\n",
                 o.afd, afd_cfg->num_attention, afd_cfg->num_ffn, mpi ? "mpi: this process is attention rank 0" : "in-process",
                 afd::connector_kind_name(afd_cfg->connector), afd_cfg->num_stages, afd::keep_alive_ms(*afd_cfg));
    }
  }

  serve::HttpServer http(*service, served,
                         {.host = so.host,
                          .port = so.port,
                          .threads = so.http_threads,
                          .request_timeout_s = so.request_timeout_s,
                          .max_body_bytes = static_cast<size_t>(so.max_body_mb) << 20},
                         o.max_batch * (afd_mode ? afd_cfg->num_attention : 1) + so.max_queued_requests + 8);
  auto port = http.bind();
  if (!port.ok()) return fail(port.status());

  std::atomic<bool> job_done{false};
  std::atomic<int> workers_up{0};  // attention ranks whose engine serves (the job is up when all of them do)
  Status job_status;
  std::thread job_thread;
  if (!afd_mode) {
    service->start();
  } else {
    const afd::AttentionServeFn worker = service_worker_fn(*service);
    const afd::AttentionServeFn serve_fn = [&workers_up, worker](int a, engine::Engine& eng, runtime::KvPagePool& pool,
                                                                 afd::AttentionIdle& idle) {
      ++workers_up;
      return worker(a, eng, pool, idle);
    };
    job_thread = std::thread([&, serve_fn] {
      Status s = mpi ? afd::run_mpi_serve_rank(*ckpt, *dev, *pages, job_options, declared, serve_fn)
                     : afd::run_inproc_serve_job(*ckpt, *dev, *pages, job_options, serve_fn);
      if (!s.ok()) service->fail(s.to_string());
      job_status = std::move(s);
      job_done = true;
    });
  }
  // Under mpirun a failed job does not return here (MPI_Abort), and mpirun, seeing a rank die or abort, sends
  // this process SIGTERM (which the signal thread takes) and SIGKILL a second later: once the service has
  // failed, this process answers the requests in flight with the error and exits 1 itself.
  auto exit_if_mpi_job_failed = [&] {
    if (!mpi || !service->failed()) return;
    service->wait_streams_released(serve::Clock::now() + std::chrono::seconds(5));
    fmt::print(stderr, "genbridge serve: the AFD job failed: {}\n", service->failure());
    std::fflush(stderr);
    std::_Exit(kExitFailed);
  };
  // The AFD job ends (stopped or failed) within its deadlines once the service stops; bounded here too.
  const auto job_bound = std::chrono::milliseconds(afd_mode ? 4 * afd_cfg->timeout_ms + 60'000 : 0);
  auto wait_job = [&] {
    const auto deadline = serve::Clock::now() + job_bound;
    while (afd_mode && !job_done.load() && serve::Clock::now() < deadline) {
      exit_if_mpi_job_failed();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return !afd_mode || job_done.load();
  };

  std::atomic<bool> listener_done{false};
  // Closes the listener; stop() before listen() started is lost, so it is repeated until listen() returns.
  auto close_listener = [&] {
    const auto deadline = serve::Clock::now() + std::chrono::seconds(30);
    while (!listener_done.load()) {
      http.stop();
      if (serve::Clock::now() > deadline) {
        fmt::print(stderr, "genbridge serve: the listener did not close within 30 s\n");
        std::_Exit(kExitFailed);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  std::thread signal_thread([&] {
    const timespec slice{0, 100'000'000};
    while (!listener_done.load()) {
      exit_if_mpi_job_failed();
      if (job_done.load() && !job_status.ok()) {
        fmt::print(stderr, "genbridge serve: the AFD job failed; answering in-flight requests and closing the listener\n");
        service->wait_streams_released(serve::Clock::now() + std::chrono::seconds(5));
        close_listener();
        return;
      }
      const int sig = sigtimedwait(&signals, nullptr, &slice);
      if (sig < 0) continue;  // EAGAIN (no signal in this slice) or EINTR
      fmt::print(stderr, "genbridge serve: {}: draining {} in-flight request(s) (--shutdown-timeout {} s) ...\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", service->in_flight(), so.shutdown_timeout_s);
      const auto deadline = serve::Clock::now() + std::chrono::duration_cast<serve::Clock::duration>(
                                                      std::chrono::duration<double>(so.shutdown_timeout_s));
      const int64_t aborted = service->shutdown(deadline);
      fmt::print(stderr, "genbridge serve: {} request(s) cancelled at the deadline; closing the listener\n", aborted);
      if (!wait_job()) fmt::print(stderr, "genbridge serve: the AFD job did not end after the drain\n");
      close_listener();
      return;
    }
  });
  // --afd: the listener opens once the job is up. Until then a client's connection waits in the listen backlog
  // (unanswered); when the job ends first (refused at init, or stopped by a signal) this process exits
  // without having answered anything. The wait is bounded by the job's own init deadlines.
  if (afd_mode) {
    if (!o.quiet) fmt::print(stderr, "genbridge serve: waiting for the AFD job to start before listening\n");
    while (workers_up.load() < afd_cfg->num_attention && !job_done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (workers_up.load() < afd_cfg->num_attention) {
      listener_done = true;
      signal_thread.join();
      job_thread.join();
      if (!job_status.ok()) return fail(job_status);
      fmt::print(stderr, "genbridge serve: stopped before listening\n");
      return kExitOk;
    }
  }
  if (!so.port_file.empty()) {
    if (Status s = write_port_file(so.port_file, *port); !s.ok()) {
      fmt::print(stderr, "genbridge serve: {}\n", s.message());
      listener_done = true;
      signal_thread.join();
      service->shutdown(serve::Clock::now());
      if (job_thread.joinable()) {
        if (!wait_job()) std::_Exit(kExitFailed);
        job_thread.join();
      }
      return kExitFailed;
    }
  }
  fmt::print(stderr, "genbridge serve: listening on http://{}:{} (model '{}', {} KV pages of {} tokens{})\n", so.host,
             *port, served.name, *pages, geometry.page_size, afd_mode ? " per attention rank" : "");
  const Status listened = http.listen();
  listener_done = true;
  signal_thread.join();
  service->shutdown(serve::Clock::now());
  if (job_thread.joinable()) {
    if (!wait_job()) {
      fmt::print(stderr, "genbridge serve: the AFD job did not end within {} ms\n", job_bound.count());
      std::_Exit(kExitFailed);
    }
    job_thread.join();
  }
  if (!listened.ok()) return fail(listened);
  if (!job_status.ok()) return fail(job_status);
  fmt::print(stderr, "genbridge serve: stopped\n");
  return kExitOk;
}

}  // namespace genbridge::tools
