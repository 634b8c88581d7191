// genbridge run --afd: attention-FFN disaggregated decoding over the in-process transport.
#include <fmt/format.h>

#include <cstdlib>

#include "afd/config.h"
#include "afd/engine_job.h"
#include "tools/run_support.h"

namespace genbridge::tools {

Result<afd::AfdConfig> afd_config_from(const RunOptions& o, bool mpi) {
  afd::AfdConfig cfg;
  GB_RETURN_IF_ERROR(afd::apply_topology_string(o.afd, &cfg));
  cfg.connector = o.afd_connector == "async" ? afd::ConnectorKind::kAsync : afd::ConnectorKind::kSync;
  cfg.async_dp = cfg.connector == afd::ConnectorKind::kAsync;
  cfg.num_stages = o.afd_stages;
  cfg.timeout_ms = static_cast<int64_t>(o.afd_timeout_s * 1000.0);
  if (mpi && o.afd_transport != "mpi") {
    return invalid_argument(fmt::format(
        "--afd-transport {}: `genbridge afd-worker` is one process of an mpirun job (mpi); for the in-process "
        "transport use `genbridge run --afd`",
        o.afd_transport));
  }
  if (!mpi && o.afd_transport != "inproc") {
    return invalid_argument(fmt::format(
        "--afd-transport {}: `genbridge run` runs every rank in this process (inproc); for MPI launch ranks with "
        "mpirun and `genbridge afd-worker` (see docs/afd_mpi.md)",
        o.afd_transport));
  }
  cfg.transport = mpi ? afd::TransportKind::kMpi : afd::TransportKind::kInproc;
  return cfg;
}

int run_afd(const RunOptions& o) {
  auto fail = [](const Status& s) {
    fmt::print(stderr, "genbridge run: {}\n", s.to_string());
    return 1;
  };
  auto cfg = afd_config_from(o, false);
  if (!cfg.ok()) return fail(cfg.status());
  auto dev = make_device(o);
  if (!dev.ok()) return fail(dev.status());
  auto dir = resolve_model_dir(o);
  if (!dir.ok()) return fail(dir.status());
  auto ckpt = model::Checkpoint::open(*dir);
  if (!ckpt.ok()) return fail(ckpt.status());
  const model::ModelConfig& mc = ckpt->config();
  if (!o.quiet) fmt::print(stderr, "{}\n", describe_model(*ckpt));
  auto reqs = make_requests(o, mc.vocab_size);
  if (!reqs.ok()) return fail(reqs.status());
  // Each attention rank gets every (r % A)-th request; size its pool for all of them.
  auto pool_probe = make_pool(*dev, mc, *reqs, o.kv_memory_mb);
  if (!pool_probe.ok()) return fail(pool_probe.status());
  const int64_t pages = pool_probe->num_pages();
  if (!o.quiet) {
    fmt::print(stderr, "AFD {}: {} attention + {} FFN ranks (in-process), {} connector, {} stage(s)\n", o.afd,
               cfg->num_attention, cfg->num_ffn, afd::connector_kind_name(cfg->connector), cfg->num_stages);
  }
  afd::EngineJobOptions jo{.afd = *cfg,
                           .engine = {.max_batch = o.max_batch, .record_logits = !o.dump_logits.empty()},
                           .warmup_steps = o.afd_warmup_steps,
                           .trace_path = o.trace};
  auto job = afd::run_inproc_engine_job(*ckpt, *dev, std::move(reqs).value(), pages, jo);
  if (!job.ok()) return fail(job.status());
  print_results(job->results);
  print_metrics(job->metrics, *dev, mc, static_cast<int64_t>(job->results.size()), job->num_ranks);
  fmt::print("\nAFD transfers and utilisation\n{}", afd::report_text(job->report));
  if (!o.trace.empty()) fmt::print(stderr, "wrote trace {}\n", o.trace);
  if (!o.dump_logits.empty()) {
    if (Status s = dump_logits(o.dump_logits, job->results, mc.vocab_size); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace genbridge::tools
