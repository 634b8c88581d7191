// genbridge afd-worker: one process of an attention-FFN disaggregated job under mpirun (Open MPI
// transport). Every process opens the checkpoint and builds the same request list; attention rank a
// decodes requests a, a + A, ...; world rank 0 prints every result in request order, the metrics and the
// AFD report. Other ranks print only errors.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>

#include "afd/engine_job.h"
#include "afd/job.h"
#include "genbridge/core/threading.h"
#include "tools/commands.h"
#include "tools/run_support.h"

namespace genbridge::tools {

namespace {

// What every process of the job must have been started with, named as the user typed it (the AFD job
// adds the model config, the requests and the engine options itself). Compared across ranks at init.
std::vector<afd::FingerprintItem> run_fingerprint(const RunOptions& o) {
  std::vector<afd::FingerprintItem> f;
  f.push_back({"--model", !o.model_dir.empty()
                              ? o.model_dir
                              : fmt::format("(none: the synthetic '{}' model, seed {})", o.preset, o.model_seed)});
  if (o.prompts.empty()) {
    f.push_back({"--num-prompts", std::to_string(o.num_prompts)});
    f.push_back({"--prompt-len", std::to_string(o.prompt_len)});
  } else {
    f.push_back({"--prompt", fmt::format("{} prompt(s), digest {}", o.prompts.size(),
                                         afd::fingerprint_digest(fmt::format("{}", fmt::join(o.prompts, ";"))))});
  }
  f.push_back({"--max-new-tokens", std::to_string(o.max_new_tokens)});
  f.push_back({"--stop-token", fmt::format("[{}]", fmt::join(o.stop_tokens, ","))});
  f.push_back({"--temperature", fmt::format("{}", o.temperature)});
  f.push_back({"--top-k", std::to_string(o.top_k)});
  f.push_back({"--top-p", fmt::format("{}", o.top_p)});
  f.push_back({"--seed", std::to_string(o.seed)});
  f.push_back({"--max-batch", std::to_string(o.max_batch)});
  f.push_back({"--kv-memory-mb", std::to_string(o.kv_memory_mb)});
  f.push_back({"--kv-cache-dtype", o.kv_cache_dtype});
  f.push_back({"--afd-warmup-steps", std::to_string(o.afd_warmup_steps)});
  return f;
}

}  // namespace

int afd_worker(const RunOptions& o, const std::string& role) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "genbridge afd-worker: {}\n", s.to_string());
    return 1;
  };
  if (o.threads > 0) set_num_threads(o.threads);
  if (o.afd.empty()) return fail(invalid_argument("--afd is required (the job's topology, e.g. 2A1F)"));
  int declared = afd::kRoleUndeclared;
  if (!role.empty()) {
    auto r = afd::parse_role(role);
    if (!r.ok()) return fail(r.status());
    declared = *r;
  }
  auto cfg = afd_config_from(o, true);
  if (!cfg.ok()) return fail(cfg.status());
  // Every process of the job would race to build the cached synthetic model: build it beforehand.
  std::filesystem::path dir = o.model_dir;
  if (dir.empty()) {
    dir = synthetic_model_dir(o);
    if (!std::filesystem::exists(dir / "config.json")) {
      return fail(invalid_argument(fmt::format(
          "no --model and the synthetic '{}' model (seed {}) is not built yet at {}; build it once before the mpirun "
          "job, e.g. `genbridge make-model --preset {} --seed {} DIR` and pass --model DIR",
          o.preset, o.model_seed, dir.string(), o.preset, o.model_seed)));
    }
  }
  auto dev = make_device(o, /*log=*/false);
  if (!dev.ok()) return fail(dev.status());
  // An FFN rank reads only the expert weights: do not pre-read every mapped page there.
  // Without --role, ranks A.. are FFN ranks (Open MPI names this process's world rank before MPI_Init).
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const bool ffn = declared == static_cast<int>(afd::Role::kFfn) ||
                   (declared == afd::kRoleUndeclared && world_rank && std::atoi(world_rank) >= cfg->num_attention);
  auto ckpt = model::Checkpoint::open(dir, {.populate = !ffn});
  if (!ckpt.ok()) return fail(ckpt.status());
  const model::ModelConfig& mc = ckpt->config();
  auto reqs = make_requests(o, mc.vocab_size);
  if (!reqs.ok()) return fail(reqs.status());
  // Each attention rank gets every (r % A)-th request; size its pool for all of them (as `run --afd`).
  // (The probe pool is freed before the job; each attention rank allocates its own.)
  int64_t pages = 0;
  {
    auto pool_probe = make_pool(*dev, mc, *reqs, o.kv_memory_mb);
    if (!pool_probe.ok()) return fail(pool_probe.status());
    pages = pool_probe->num_pages();
  }
  afd::EngineJobOptions jo{.afd = *cfg,
                           .fingerprint = run_fingerprint(o),
                           .engine = {.max_batch = o.max_batch, .record_logits = !o.dump_logits.empty()},
                           .warmup_steps = o.afd_warmup_steps,
                           .trace_path = o.trace};
  auto job = afd::run_mpi_engine_rank(*ckpt, *dev, std::move(reqs).value(), pages, jo, declared);
  if (!job.ok()) return fail(job.status());
  if (job->num_ranks == 0) return 0;  // not world rank 0: rank 0 prints the job's results
  if (!o.quiet) {
    fmt::print(stderr, "{}\n{}\n", dev->log_line(), describe_model(*ckpt));
    fmt::print(stderr, "AFD {}: {} attention + {} FFN ranks (mpi), {} connector, {} stage(s)\n", o.afd,
               cfg->num_attention, cfg->num_ffn, afd::connector_kind_name(cfg->connector), cfg->num_stages);
  }
  print_results(job->results);
  print_metrics(job->metrics, *dev, mc, static_cast<int64_t>(job->results.size()), job->num_ranks);
  fmt::print("\nAFD transfers and utilisation\n{}", afd::report_text(job->report));
  if (!o.trace.empty()) fmt::print(stderr, "wrote trace {}\n", o.trace);
  if (!o.dump_logits.empty()) {
    if (Status s = dump_logits(o.dump_logits, job->results, mc.vocab_size); !s.ok()) return fail(s);
  }
  int refused = 0;
  for (const auto& r : job->results) refused += r.reason == engine::FinishReason::kRefused;
  return refused ? 3 : 0;
}

}  // namespace genbridge::tools
