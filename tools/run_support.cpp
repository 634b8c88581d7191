#include "tools/run_support.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

#include "runtime/engine/npy.h"

namespace genbridge::tools {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

Result<runtime::DeviceOperator> make_device(const RunOptions& o, bool log) {
  const char* env_soc = std::getenv("GENBRIDGE_SOC");
  GB_ASSIGN_OR_RETURN(runtime::DeviceOperator dev,
                      runtime::DeviceOperator::create(
                          {.soc = !o.soc.empty() ? o.soc : (env_soc ? env_soc : ""), .kv_cache_dtype = o.kv_cache_dtype}));
  if (log && !o.quiet) fmt::print(stderr, "{}\n", dev.log_line());
  return dev;
}

Result<model::Checkpoint> open_checkpoint(const std::filesystem::path& dir, const RunOptions& o, bool populate) {
  GB_ASSIGN_OR_RETURN(model::Checkpoint ckpt,
                      model::Checkpoint::open(dir, {.populate = populate, .use_mmap = !o.no_mmap}));
  if (o.check_weights) {
    // The cost line is printed even with --quiet: it is what --check-weights was asked for.
    model::WeightScan scan;
    const Status finite = ckpt.check_finite(&scan);
    fmt::print(stderr, "check-weights: {} tensors, {:.1f} MiB scanned in {:.3g} s ({:.1f} GB/s): {}\n", scan.tensors,
               static_cast<double>(scan.bytes) / (1 << 20), scan.seconds,
               scan.seconds > 0 ? static_cast<double>(scan.bytes) / scan.seconds / 1e9 : 0.0,
               finite.ok() ? "all finite" : "a weight is not finite");
    GB_RETURN_IF_ERROR(finite);
  }
  return ckpt;
}

std::string describe_model(const model::Checkpoint& ckpt) {
  const model::ModelConfig& c = ckpt.config();
  return fmt::format(
      "model {}: {} layers ({} MoE: {} experts, top-{}{}), hidden {}, heads {}/{} x {}, vocab {}, {} norm, {:.1f} MiB "
      "of weights",
      ckpt.dir().string(), c.num_hidden_layers, c.num_moe_layers(), c.num_experts, c.num_experts_per_tok,
      c.has_shared_expert() ? " + shared expert" : "", c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
      c.head_dim, c.vocab_size, model::norm_type_name(c.norm_type),
      static_cast<double>(ckpt.mapped_weight_bytes() + ckpt.converted_weight_bytes()) / (1 << 20));
}

Result<runtime::KvPagePool> make_pool(const runtime::DeviceOperator& dev, const model::ModelConfig& cfg,
                                      const std::vector<engine::Request>& reqs, int64_t kv_memory_mb) {
  const runtime::KvPageGeometry g =
      dev.kv_page_geometry({cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim});
  if (kv_memory_mb > 0) return runtime::KvPagePool::create_for_budget(g, kv_memory_mb << 20);
  int64_t pages = 0;
  for (const auto& r : reqs) {
    const int64_t tokens = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens - 1;
    pages += (tokens + g.page_size - 1) / g.page_size;
  }
  return runtime::KvPagePool::create(g, std::max<int64_t>(pages, 1));
}

void print_results(const std::vector<engine::RequestResult>& results) {
  for (const auto& r : results) {
    if (r.reason == engine::FinishReason::kRefused) {
      fmt::print("request {}: refused: {}\n", r.id, r.message);
      continue;
    }
    fmt::print("request {} ({}, {} tokens): {}\n", r.id, engine::finish_reason_name(r.reason), r.tokens.size(),
               fmt::join(r.tokens, " "));
  }
}

void print_metrics(const engine::EngineMetrics& m, const runtime::DeviceOperator& dev, const model::ModelConfig& cfg,
                   int64_t num_requests, int num_ranks) {
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  fmt::print("\n{:<34} {}\n", "metric", "value");
  fmt::print("{:<34} {:.1f}\n", "prefill tokens/s", rate(m.prefill_tokens, m.prefill_seconds));
  fmt::print("{:<34} {:.1f}\n", "decode tokens/s", rate(m.decode_tokens, m.decode_seconds));
  if (num_ranks > 1) {
    fmt::print("{:<34} {:.1f}\n", fmt::format("decode tokens/s per rank ({} ranks)", num_ranks),
               rate(m.decode_tokens, m.decode_seconds) / num_ranks);
  }
  fmt::print("{:<34} {:.2f} / {:.2f}\n", "TTFT p50 / p99 (ms)", 1e3 * engine::percentile(m.ttft_seconds, 50),
             1e3 * engine::percentile(m.ttft_seconds, 99));
  fmt::print("{:<34} {:.2f} / {:.2f}\n", "TPOT p50 / p99 (ms)", 1e3 * engine::percentile(m.tpot_seconds, 50),
             1e3 * engine::percentile(m.tpot_seconds, 99));
  fmt::print("{:<34} {} ({} bytes per token, all {} layers)\n", "KV representation",
             ops::kv_cache_format_name(dev.kv_format()), m.kv_bytes_per_token, cfg.num_hidden_layers);
  fmt::print("{:<34} {} prefill + {} decode\n", "tokens", m.prefill_tokens, m.decode_tokens);
  fmt::print("{:<34} {} finished, {} refused\n", "requests", num_requests - m.requests_refused, m.requests_refused);
}

Status dump_logits(const std::string& path, const std::vector<engine::RequestResult>& results, int64_t vocab) {
  std::vector<float> all;
  int64_t rows = 0;
  for (const auto& r : results) {
    all.insert(all.end(), r.logits.begin(), r.logits.end());
    rows += static_cast<int64_t>(r.logits.size()) / vocab;
  }
  GB_RETURN_IF_ERROR(engine::write_npy_f32(path, all, rows, vocab));
  fmt::print(stderr, "wrote {} logit rows x {} to {}\n", rows, vocab, path);
  return ok_status();
}

ProgressPrinter::ProgressPrinter(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO)), start_(now_s()) {}

void ProgressPrinter::update(const engine::Progress& p) {
  if (quiet_) return;
  const double t = now_s();
  const bool last = p.finished == p.total;
  if (!last && t - last_print_ < (tty_ ? 0.2 : 2.0)) return;
  last_print_ = t;
  const std::string line = fmt::format("[{:6.1f} s] requests {}/{} finished, {} running, {} waiting; {} tokens generated",
                                       t - start_, p.finished, p.total, p.running, p.waiting, p.generated_tokens);
  if (tty_) {
    fmt::print(stderr, "\r{:<100}", line);
  } else {
    fmt::print(stderr, "{}\n", line);
  }
  printed_ = true;
}

void ProgressPrinter::clear() {
  if (printed_ && tty_) fmt::print(stderr, "\n");
  printed_ = false;
}

}  // namespace genbridge::tools
