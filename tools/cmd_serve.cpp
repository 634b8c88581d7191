// genbridge serve: an OpenAI-compatible HTTP server over the continuous-batching engine.
//   check the flags -> device -> model (+ tokenizer.json, tokenizer_config.json) -> KV pool -> engine thread
//   -> HTTP listener -> (SIGTERM / SIGINT) drain: new requests 503, in-flight ones finish until
//   --shutdown-timeout, the rest are cancelled -> close the listener -> exit 0.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "runtime/engine/engine.h"
#include "runtime/model/runner.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"
#include "tools/commands.h"
#include "tools/run_support.h"
#include "tools/serve/http_server.h"
#include "tools/serve/service.h"

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
  if (Status s = check_run_flags(o, RunMode::kMonolithic); !s.ok()) return usage(s);
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

  if (o.threads > 0) set_num_threads(o.threads);
  auto dev = make_device(o);
  if (!dev.ok()) return fail(dev.status());
  if (!o.quiet) fmt::print(stderr, "{}\n{}\n", dev->log_line(), cpu_target_line());
  auto dir = resolve_model_dir(o, /*build=*/true);
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

  // The KV pool: --kv-memory-mb, or room for --max-batch sequences of the whole context.
  const runtime::KvPageGeometry geometry =
      dev->kv_page_geometry(model::kv_model_shape(mc));
  std::vector<engine::Request> sizing(static_cast<size_t>(o.max_batch));
  for (auto& r : sizing) {
    r.prompt = {0};
    r.max_new_tokens = static_cast<int>(mc.max_position_embeddings);
  }
  auto pages = kv_pool_pages(o, geometry, sizing, 1, 1);
  if (!pages.ok()) return usage(pages.status());
  auto pool = runtime::KvPagePool::create(geometry, *pages);
  if (!pool.ok()) return fail(pool.status());
  auto runner = model::ModelRunner::create(*ckpt, *dev, *pool);
  if (!runner.ok()) return fail(runner.status());
  engine::LocalExecutor executor(**runner);

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
  served.kv_pages = pool->num_pages();
  served.kv_page_size = geometry.page_size;
  served.kv_memory_mb = o.kv_memory_mb;
  served.default_max_tokens = so.default_max_tokens;

  serve::GenerationService service(executor, *pool,
                                   {.max_batch = o.max_batch, .max_queued_requests = so.max_queued_requests});
  serve::HttpServer http(
      service, served,
      {.host = so.host, .port = so.port, .threads = so.http_threads, .request_timeout_s = so.request_timeout_s},
      o.max_batch + so.max_queued_requests + 8);
  auto port = http.bind();
  if (!port.ok()) return fail(port.status());
  service.start();

  std::atomic<bool> listener_done{false};
  std::thread signal_thread([&] {
    const timespec slice{0, 100'000'000};
    while (!listener_done.load()) {
      const int sig = sigtimedwait(&signals, nullptr, &slice);
      if (sig < 0) continue;  // EAGAIN (no signal in this slice) or EINTR
      fmt::print(stderr, "genbridge serve: {}: draining {} in-flight request(s) (--shutdown-timeout {} s) ...\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT", service.in_flight(), so.shutdown_timeout_s);
      const auto deadline = serve::Clock::now() + std::chrono::duration_cast<serve::Clock::duration>(
                                                      std::chrono::duration<double>(so.shutdown_timeout_s));
      const int64_t aborted = service.shutdown(deadline);
      fmt::print(stderr, "genbridge serve: {} request(s) cancelled at the deadline; closing the listener\n", aborted);
      http.stop();
      return;
    }
  });
  if (!so.port_file.empty()) {
    if (Status s = write_port_file(so.port_file, *port); !s.ok()) {
      fmt::print(stderr, "genbridge serve: {}\n", s.message());
      listener_done = true;
      signal_thread.join();
      service.shutdown(serve::Clock::now());
      return kExitFailed;
    }
  }
  fmt::print(stderr, "genbridge serve: listening on http://{}:{} (model '{}', {} KV pages of {} tokens)\n", so.host,
             *port, served.name, pool->num_pages(), geometry.page_size);
  const Status listened = http.listen();
  listener_done = true;
  signal_thread.join();
  service.shutdown(serve::Clock::now());
  if (!listened.ok()) return fail(listened);
  fmt::print(stderr, "genbridge serve: stopped\n");
  return kExitOk;
}

}  // namespace genbridge::tools
