#include "afd/job.h"

#include <fmt/format.h>

#include <mutex>
#include <thread>
#include <vector>

#include "afd/transports/inproc/inproc_transport.h"

namespace genbridge::afd {

Result<int> parse_role(std::string_view text) {
  if (text == "attention") return static_cast<int>(Role::kAttention);
  if (text == "ffn") return static_cast<int>(Role::kFfn);
  return invalid_argument(fmt::format("afd: --role is '{}' but must be 'attention' or 'ffn'", text));
}

namespace {

// Runs one rank over an initialised connector, then gathers metrics at world rank 0.
Status run_rank(Connector& c, const AfdConfig& cfg, const RankFns& fns, const JobOptions& options) {
  Metrics metrics(cfg, c.world_rank(), c.role(), c.rank(), options.trace_events);
  c.set_metrics(&metrics);
  const auto& fn = c.role() == Role::kAttention ? fns.attention : fns.ffn;
  if (!fn) return invalid_argument(fmt::format("afd job: no function for the {} role", role_name(c.role())));
  GB_RETURN_IF_ERROR(fn(c, metrics));
  c.set_metrics(nullptr);
  if (options.report == nullptr && options.trace_path.empty()) return ok_status();
  // Ranks finish far apart (e.g. async_dp attention ranks with different amounts of work).
  GB_ASSIGN_OR_RETURN(std::vector<std::string> blobs, c.gather(metrics.serialize(), cfg.idle_timeout_ms));
  if (c.world_rank() != 0) return ok_status();
  std::vector<Metrics> all;
  for (const std::string& b : blobs) {
    GB_ASSIGN_OR_RETURN(Metrics m, Metrics::deserialize(b));
    all.push_back(std::move(m));
  }
  if (options.report) *options.report = summarize(all);
  if (!options.trace_path.empty()) GB_RETURN_IF_ERROR(write_chrome_trace(options.trace_path, all));
  return ok_status();
}

}  // namespace

Status run_inproc_job(const AfdConfig& cfg, const RankFns& fns, const JobOptions& options) {
  GB_ASSIGN_OR_RETURN(const ValidAfdConfig valid, ValidAfdConfig::create(cfg));
  return run_inproc_job(valid, fns, options);
}

Status run_inproc_job(const ValidAfdConfig& cfg, const RankFns& fns, const JobOptions& options) {
  const int n = cfg->num_attention + cfg->num_ffn;
  std::shared_ptr<InprocWorld> world = make_inproc_world(n, cfg->init_timeout_ms);
  std::vector<Status> results(n);
  std::mutex mu;
  Status root;  // the first failure, in the failed rank's own words
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Connector> c;
      Status s = [&]() -> Status {
        GB_ASSIGN_OR_RETURN(c, make_connector(cfg, make_inproc_transport(world, r)));
        GB_RETURN_IF_ERROR(c->init(options.fingerprint));
        GB_RETURN_IF_ERROR(run_rank(*c, cfg, fns, options));
        return c->close();
      }();
      if (!s.ok()) {
        {
          std::lock_guard lock(mu);
          if (root.ok()) {
            const std::string who = c && c->world_rank() == r && !c->topology().roles.empty()
                                        ? c->topology().rank_name(r)
                                        : fmt::format("world rank {}", r);
            root = Status(s.code(), fmt::format("{} failed: {}", who, s.message()));
          }
        }
        // Wakes every other rank's waits with an error naming this rank.
        if (c) {
          c->abort_job(s);
        } else {
          fail_rank(*world, r, s);
        }
      }
      results[r] = std::move(s);
    });
  }
  for (std::thread& t : threads) t.join();
  if (!root.ok()) {
    int failed = 0;
    for (const Status& s : results) failed += !s.ok();
    return Status(root.code(),
                  fmt::format("afd job failed ({} of {} ranks ended with an error): {}", failed, n, root.message()));
  }
  return ok_status();
}

Status run_mpi_rank(const AfdConfig& cfg, int declared_role, const RankFns& fns, const JobOptions& options) {
  GB_ASSIGN_OR_RETURN(const ValidAfdConfig valid, ValidAfdConfig::create(cfg));
  return run_mpi_rank(valid, declared_role, fns, options);
}

Status run_mpi_rank(const ValidAfdConfig& cfg, int declared_role, const RankFns& fns, const JobOptions& options) {
  MpiOptions mo;
  mo.declared_role = declared_role;
  mo.init_timeout_ms = cfg->init_timeout_ms;
  mo.close_timeout_ms = cfg->idle_timeout_ms;
  GB_ASSIGN_OR_RETURN(std::unique_ptr<Connector> c, make_connector(cfg, make_mpi_transport(mo)));
  Status st = c->init(options.fingerprint);
  if (st.ok()) st = run_rank(*c, cfg, fns, options);
  if (!st.ok()) {
    // Does not return once MPI is up; before that (e.g. not under mpirun) it returns and so do we.
    c->abort_job(st);
    return st;
  }
  st = c->close();
  if (!st.ok()) c->abort_job(st);  // e.g. a rank never reached the end: the others must not hang in MPI_Finalize
  return st;
}

}  // namespace genbridge::afd
