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
#include "afd/transport.h"
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
  bool prints = true;                     // false on every rank of an mpirun job but world rank 0
  std::vector<std::string> weight_lines;  // mpirun with --weight-quant: each rank's share (world rank 0)
};

Result<RunOutput> run_monolithic(const RunOptions& o, const StartedModel& m, std::vector<engine::Request> reqs,
                                 const engine::AssemblyOptions& assembly, int64_t pages) {
  std::optional<engine::StepTrace> trace;  // --trace: every phase of every forward
  const engine::ExecutorFactory traced = [&](const model::ModelRunner& runner) {
    auto executor = std::make_unique<engine::LocalExecutor>(runner);
    executor->set_trace(&trace.emplace());
    return Result<std::unique_ptr<engine::ForwardExecutor>>(std::move(executor));
  };
  GB_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::AssembledEngine> job,
      engine::assemble_engine(m.ckpt, m.dev, pages, assembly, o.trace.empty() ? engine::ExecutorFactory() : traced));
  engine::Engine& eng = *job->engine;
  for (auto& r : reqs) GB_RETURN_IF_ERROR(eng.submit(std::move(r)));
  ProgressPrinter progress(o.quiet);
  const Status s = eng.run_to_completion([&](const engine::Progress& p) { progress.update(p); });
  progress.clear();
  GB_RETURN_IF_ERROR(s);
  if (trace) GB_RETURN_IF_ERROR(trace->write(o.trace));  // an output file: written before anything is printed
  return RunOutput{.results = eng.results(), .metrics = eng.metrics()};
}

// `run --afd` (every rank in this process) or this rank of an mpirun job (`afd-worker`).
Result<RunOutput> run_afd(const RunOptions& o, RunMode mode, const afd::AfdConfig& afd_cfg, int declared,
                          const StartedModel& m, std::vector<engine::Request> reqs,
                          const engine::AssemblyOptions& assembly, int64_t pages) {
  afd::EngineJobOptions jo{.afd = afd_cfg,
                           .engine = assembly.engine,
                           .warmup_steps = o.afd_warmup_steps,
                           .trace_path = o.trace,
                           .quantized = assembly.quantized};
  GB_ASSIGN_OR_RETURN(jo.expert_load, expert_load_from(o));
  GB_ASSIGN_OR_RETURN(jo.fingerprint, run_fingerprint(o, m.ckpt, reqs));
  GB_ASSIGN_OR_RETURN(afd::EngineJobResult job,
                      mode == RunMode::kAfdMpi
                          ? afd::run_mpi_engine_rank(m.ckpt, m.dev, std::move(reqs), pages, jo, declared)
                          : afd::run_inproc_engine_job(m.ckpt, m.dev, std::move(reqs), pages, jo));
  return RunOutput{.results = std::move(job.results),
                   .metrics = std::move(job.metrics),
                   .report = std::move(job.report),
                   .num_ranks = job.num_ranks,
                   .prints = job.num_ranks != 0,
                   .weight_lines = std::move(job.weight_lines)};
}

// The output files, then (under mpirun, where nothing was printed as it came) the header lines, then the
// results, the metrics and the AFD report. The exit code.
int write_and_print(const RunOptions& o, RunMode mode, const StartedModel& m, const std::string& afd_line,
                    const text::Tokenizer* tokenizer, const RunOutput& out, const Reporter& report) {
  const model::ModelConfig& mc = m.ckpt.config();
  // Output files first: a failed write must not follow printed results.
  if (!o.dump_logits.empty()) {
    if (Status s = dump_logits(o.dump_logits, out.results, mc.vocab_size); !s.ok()) return report.fail(s);
  }
  if (!o.dump_choices.empty()) {
    if (Status s = dump_choices(o.dump_choices, out.results); !s.ok()) return report.fail(s);
  }
  if (!o.trace.empty()) fmt::print(stderr, "wrote trace {}\n", o.trace);
  if (!o.afd_expert_load_out.empty() && out.report) {
    const afd::ExpertLoad load = afd::measured_expert_load(*out.report, mc);
    if (Status s = afd::write_expert_load(o.afd_expert_load_out, load); !s.ok()) return report.fail(s);
    fmt::print(stderr, "wrote expert load {}\n", o.afd_expert_load_out);
  }
  if (mode == RunMode::kAfdMpi && !o.quiet) {
    std::string weights = describe_weights(m.ckpt, m.quantized.get());
    if (!out.weight_lines.empty()) {  // each rank quantized its share: its load cost (time and bytes)
      weights = "weights quantized per rank at load:";
      for (const std::string& l : out.weight_lines) weights += "\n  " + l;
    }
    fmt::print(stderr, "{}\n{}\n{}\n{}\n{}\n", m.dev.log_line(), cpu_target_line(), describe_model(m.ckpt), weights,
               afd_line);
  }
  print_results(out.results, tokenizer);
  print_metrics(out.metrics, m.dev, mc, static_cast<int64_t>(out.results.size()), out.num_ranks);
  if (out.report) fmt::print("\nAFD transfers and utilisation\n{}", afd::report_text(*out.report));
  for (const auto& r : out.results) {
    if (!engine::completed(r)) return kExitRefused;  // refused, or ended by non-finite logits
  }
  return kExitOk;
}

int run_job(RunOptions o, RunMode mode, const std::string& role) {
  const Reporter report{run_command_name(mode)};
  const bool afd_mode = mode != RunMode::kMonolithic;
  const bool mpi = mode == RunMode::kAfdMpi;

  if (Status s = check_run_flags(o, mode); !s.ok()) return report.usage(s);
  int declared = afd::kRoleUndeclared;
  if (!role.empty()) {
    auto r = afd::parse_role(role);
    if (!r.ok()) return report.usage(r.status());
    declared = *r;
  }
  std::optional<afd::AfdConfig> afd_cfg;
  if (afd_mode) afd_cfg = afd_config_from(o, mode).value();  // checked above

  // An FFN rank of an mpirun job reads only the expert weights: do not pre-read every mapped page there.
  // Without --role, ranks A.. are FFN ranks (Open MPI names this process's world rank before MPI_Init).
  const bool ffn_rank = mpi && afd::launcher_says_ffn(declared, afd_cfg->num_attention);
  // Under mpirun rank 0 prints the header lines with the results; other modes print them as they go.
  const bool log_now = !o.quiet && !mpi;
  int code = kExitOk;
  const std::unique_ptr<StartedModel> m =
      start_model(o, {.mode = mode, .log = log_now, .build_model = !mpi, .populate = !ffn_rank}, report, &code);
  if (!m) return code;
  const model::ModelConfig& mc = m->ckpt.config();
  // --prompt-text: encoded with the model's own tokenizer; the results are decoded with it too.
  std::optional<text::Tokenizer> tokenizer;
  if (!o.prompt_texts.empty()) {
    if (Status s = check_model_has_tokenizer(m->dir); !s.ok()) return report.usage(s);
    auto tok = text::Tokenizer::load(m->dir / "tokenizer.json");
    if (!tok.ok()) return report.fail(tok.status());
    if (Status s = encode_prompt_texts(*tok, &o); !s.ok()) return report.usage(s);
    tokenizer = std::move(tok).value();
  }
  if (Status s = check_run_flags_against_model(o, mode, mc); !s.ok()) return report.usage(s);

  std::vector<engine::Request> reqs = make_requests(o, mc.vocab_size);
  // Each attention rank has its own pool for its requests (r % A); `run --afd` holds all of them.
  const int pools = afd_mode ? afd_cfg->num_attention : 1;
  const engine::AssemblyOptions assembly =
      assembly_options(o, kv_pool_options(o, pools, mode == RunMode::kAfdInproc ? pools : 1), m->quantized.get());
  auto plan = engine::plan_kv_pool(assembly.kv_pool, m->dev, mc, reqs);
  if (!plan.ok()) return report.usage(plan.status());

  const std::string afd_line =
      afd_mode ? fmt::format("AFD {}: {} attention + {} FFN ranks ({}), {} connector, {} stage(s){}", o.afd,
                             afd_cfg->num_attention, afd_cfg->num_ffn, mpi ? "mpi" : "in-process",
                             afd::connector_kind_name(afd_cfg->connector), afd_cfg->num_stages,
                             describe_redundant_experts(o))
               : std::string();
  if (afd_mode && log_now) fmt::print(stderr, "{}\n", afd_line);
  auto out = afd_mode ? run_afd(o, mode, *afd_cfg, declared, *m, std::move(reqs), assembly, plan->pages)
                      : run_monolithic(o, *m, std::move(reqs), assembly, plan->pages);
  if (!out.ok()) return report.fail(out.status());
  if (!out->prints) return kExitOk;  // not world rank 0: rank 0 writes and prints the job's results
  return write_and_print(o, mode, *m, afd_line, tokenizer ? &*tokenizer : nullptr, *out, report);
}

}  // namespace

int run(const RunOptions& o) { return run_job(o, o.afd.empty() ? RunMode::kMonolithic : RunMode::kAfdInproc, ""); }

int afd_worker(const RunOptions& o, const std::string& role) { return run_job(o, RunMode::kAfdMpi, role); }

}  // namespace genbridge::tools
