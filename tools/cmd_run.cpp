// genbridge run, run --afd and afd-worker: the one run path. Whatever the mode, a run goes
//   check the flags -> device -> model -> check the flags against the model -> requests -> KV pool size
//   -> engine (monolithic) or AFD job (in-process or this rank of an mpirun job) -> write the output files
//   -> print the results, the metrics and the AFD report -> exit code
// and exits with the same codes (tools/commands.h): 0 every request finished, 3 some request was
// refused or ended by an error (non-finite logits), 1 the run failed, 2 the command line is invalid.
// Nothing is printed as a result before every step that can fail has succeeded (the output files are
// written before the results are printed).
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <optional>

#include "afd/engine_job.h"
#include "afd/job.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/engine/engine.h"
#include "runtime/forward/runner.h"
#include "text/tokenizer.h"
#include "tools/commands.h"
#include "tools/fingerprint.h"
#include "tools/run_support.h"

namespace genbridge::tools {
namespace {

// What an engine or a job hands back, whatever the mode.
struct RunOutput {
  std::vector<engine::RequestResult> results;
  engine::EngineMetrics metrics;
  std::optional<afd::AfdReport> report;  // AFD modes
  int num_ranks = 1;
  bool prints = true;  // false on every rank of an mpirun job but world rank 0
  std::vector<std::string> weight_lines;  // mpirun with --weight-quant: each rank's share (world rank 0)
};

Result<RunOutput> run_monolithic(const RunOptions& o, const model::Checkpoint& ckpt, const runtime::DeviceOperator& dev,
                                 const model::QuantizedWeights* quantized, std::vector<engine::Request> reqs,
                                 int64_t pages) {
  const model::ModelConfig& c = ckpt.config();
  GB_ASSIGN_OR_RETURN(runtime::KvPagePool pool,
                      runtime::KvPagePool::create(
                          dev.kv_page_geometry(model::kv_model_shape(c)), pages));
  GB_ASSIGN_OR_RETURN(std::unique_ptr<model::ModelRunner> runner, model::ModelRunner::create(ckpt, dev, pool, quantized));
  engine::LocalExecutor executor(*runner);
  std::optional<engine::StepTrace> trace;  // --trace: every phase of every forward
  if (!o.trace.empty()) executor.set_trace(&trace.emplace());
  engine::Engine eng(
      executor, pool,
      {.max_batch = o.max_batch, .record_logits = !o.dump_logits.empty(), .record_choices = !o.dump_choices.empty()});
  for (auto& r : reqs) GB_RETURN_IF_ERROR(eng.submit(std::move(r)));
  ProgressPrinter progress(o.quiet);
  const Status s = eng.run_to_completion([&](const engine::Progress& p) { progress.update(p); });
  progress.clear();
  GB_RETURN_IF_ERROR(s);
  if (trace) GB_RETURN_IF_ERROR(trace->write(o.trace));  // an output file: written before anything is printed
  return RunOutput{.results = eng.results(), .metrics = eng.metrics()};
}

int run_job(RunOptions o, RunMode mode, const std::string& role) {
  const char* cmd = run_command_name(mode);
  auto usage = [&](const Status& s) {
    fmt::print(stderr, "genbridge {}: {}\n", cmd, s.message());
    return kExitUsage;
  };
  auto fail = [&](const Status& s) {
    fmt::print(stderr, "genbridge {}: {}\n", cmd, s.to_string());
    return kExitFailed;
  };
  const bool afd_mode = mode != RunMode::kMonolithic;
  const bool mpi = mode == RunMode::kAfdMpi;

  if (Status s = check_run_flags(o, mode); !s.ok()) return usage(s);
  int declared = afd::kRoleUndeclared;
  if (!role.empty()) {
    auto r = afd::parse_role(role);
    if (!r.ok()) return usage(r.status());
    declared = *r;
  }
  std::optional<afd::AfdConfig> afd_cfg;
  if (afd_mode) afd_cfg = afd_config_from(o, mode).value();  // checked above
  if (o.threads > 0) set_num_threads(o.threads);

  auto dev = make_device(o);
  if (!dev.ok()) return fail(dev.status());
  // Under mpirun rank 0 prints the header lines with the results; other modes print them as they go.
  const bool log_now = !o.quiet && !mpi;
  if (log_now) fmt::print(stderr, "{}\n{}\n", dev->log_line(), cpu_target_line());

  auto dir = resolve_model_dir(o, /*build=*/!mpi);
  if (!dir.ok()) return fail(dir.status());
  // An FFN rank of an mpirun job reads only the expert weights: do not pre-read every mapped page there.
  // Without --role, ranks A.. are FFN ranks (Open MPI names this process's world rank before MPI_Init).
  const char* world_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const bool ffn_rank =
      mpi && (declared == static_cast<int>(afd::Role::kFfn) ||
              (declared == afd::kRoleUndeclared && world_rank && std::atoi(world_rank) >= afd_cfg->num_attention));
  auto ckpt = open_checkpoint(*dir, o, /*populate=*/!ffn_rank);
  if (!ckpt.ok()) return fail(ckpt.status());
  const model::ModelConfig& mc = ckpt->config();
  if (log_now) fmt::print(stderr, "{}\n", describe_model(*ckpt));
  // --weight-quant: quantized once here, before any request runs (progress on a terminal, cost printed);
  // under mpirun each rank quantizes only its share once it knows its role (afd::run_mpi_engine_rank).
  auto quantized = mpi ? Result<std::unique_ptr<model::QuantizedWeights>>(std::unique_ptr<model::QuantizedWeights>())
                       : quantize_weights(*ckpt, *dev, log_now);
  if (!quantized.ok()) return fail(quantized.status());
  if (log_now) fmt::print(stderr, "{}\n", describe_weights(*ckpt, quantized->get()));
  // --prompt-text: encoded with the model's own tokenizer; the results are decoded with it too.
  std::optional<text::Tokenizer> tokenizer;
  if (!o.prompt_texts.empty()) {
    if (Status s = check_model_has_tokenizer(*dir); !s.ok()) return usage(s);
    auto tok = text::Tokenizer::load(*dir / "tokenizer.json");
    if (!tok.ok()) return fail(tok.status());
    if (Status s = encode_prompt_texts(*tok, &o); !s.ok()) return usage(s);
    tokenizer = std::move(tok).value();
  }
  if (Status s = check_run_flags_against_model(o, mode, mc); !s.ok()) return usage(s);

  std::vector<engine::Request> reqs = make_requests(o, mc.vocab_size);
  // Each attention rank has its own pool for its requests (r % A); `run --afd` holds all of them.
  const int pools = afd_mode ? afd_cfg->num_attention : 1;
  auto pages = kv_pool_pages(o, dev->kv_page_geometry(model::kv_model_shape(mc)),
                             reqs, pools, mode == RunMode::kAfdInproc ? pools : 1);
  if (!pages.ok()) return usage(pages.status());

  const std::string afd_line =
      afd_mode ? fmt::format("AFD {}: {} attention + {} FFN ranks ({}), {} connector, {} stage(s)", o.afd,
                             afd_cfg->num_attention, afd_cfg->num_ffn, mpi ? "mpi" : "in-process",
                             afd::connector_kind_name(afd_cfg->connector), afd_cfg->num_stages)
               : std::string();
  RunOutput out;
  if (!afd_mode) {
    auto r = run_monolithic(o, *ckpt, *dev, quantized->get(), std::move(reqs), *pages);
    if (!r.ok()) return fail(r.status());
    out = std::move(r).value();
  } else {
    if (log_now) fmt::print(stderr, "{}\n", afd_line);
    afd::EngineJobOptions jo{.afd = *afd_cfg,
                             .engine = {.max_batch = o.max_batch,
                                        .record_logits = !o.dump_logits.empty(),
                                        .record_choices = !o.dump_choices.empty()},
                             .warmup_steps = o.afd_warmup_steps,
                             .trace_path = o.trace,
                             .quantized = quantized->get()};
    auto fp = run_fingerprint(o, *ckpt, reqs);
    if (!fp.ok()) return fail(fp.status());
    jo.fingerprint = std::move(fp).value();
    auto job = mpi ? afd::run_mpi_engine_rank(*ckpt, *dev, std::move(reqs), *pages, jo, declared)
                   : afd::run_inproc_engine_job(*ckpt, *dev, std::move(reqs), *pages, jo);
    if (!job.ok()) return fail(job.status());
    out = RunOutput{.results = std::move(job->results),
                    .metrics = std::move(job->metrics),
                    .report = std::move(job->report),
                    .num_ranks = job->num_ranks,
                    .prints = job->num_ranks != 0,
                    .weight_lines = std::move(job->weight_lines)};
  }
  if (!out.prints) return kExitOk;  // not world rank 0: rank 0 writes and prints the job's results

  // Output files first: a failed write must not follow printed results.
  if (!o.dump_logits.empty()) {
    if (Status s = dump_logits(o.dump_logits, out.results, mc.vocab_size); !s.ok()) return fail(s);
  }
  if (!o.dump_choices.empty()) {
    if (Status s = dump_choices(o.dump_choices, out.results); !s.ok()) return fail(s);
  }
  if (!o.trace.empty()) fmt::print(stderr, "wrote trace {}\n", o.trace);
  if (mpi && !o.quiet) {
    std::string weights = describe_weights(*ckpt, quantized->get());
    if (!out.weight_lines.empty()) {  // each rank quantized its share: its load cost (time and bytes)
      weights = "weights quantized per rank at load:";
      for (const std::string& l : out.weight_lines) weights += "\n  " + l;
    }
    fmt::print(stderr, "{}\n{}\n{}\n{}\n{}\n", dev->log_line(), cpu_target_line(), describe_model(*ckpt), weights,
               afd_line);
  }
  print_results(out.results, tokenizer ? &*tokenizer : nullptr);
  print_metrics(out.metrics, *dev, mc, static_cast<int64_t>(out.results.size()), out.num_ranks);
  if (out.report) fmt::print("\nAFD transfers and utilisation\n{}", afd::report_text(*out.report));
  for (const auto& r : out.results) {
    if (!engine::completed(r)) return kExitRefused;  // refused, or ended by non-finite logits
  }
  return kExitOk;
}

}  // namespace

int run(const RunOptions& o) { return run_job(o, o.afd.empty() ? RunMode::kMonolithic : RunMode::kAfdInproc, ""); }

int afd_worker(const RunOptions& o, const std::string& role) { return run_job(o, RunMode::kAfdMpi, role); }

}  // namespace genbridge::tools
