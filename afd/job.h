#pragma once
// Whole-job helpers: run every rank of an AFD job as threads of this process (in-process transport), or
// run this process's rank of an MPI job. They own the connector's lifetime (create, init, close), the
// per-rank Metrics, the failure policy and the final metric gathering; the caller supplies what a rank
// does (typically an AttentionRunner loop or FfnRunner::run()).
//
// Failure policy: when a rank's function fails, the whole job ends. In-process: the failed rank is
// marked in the world, every other rank's waits end at once with an error naming it, all threads are
// joined and the job's error names the failed rank. MPI: the error is printed and MPI_Abort ends every
// process (mpirun exits non-zero); a killed process is caught by mpirun itself. Nothing is reported
// as a result after a failure.

#include <functional>
#include <string>

#include "afd/config.h"
#include "afd/connector.h"
#include "afd/metrics.h"
#include "afd/transport.h"
#include "genbridge/core/status.h"

namespace genbridge::afd {

struct RankFns {
  // Runs one attention rank to completion (its steps, then connector.finish()). `metrics` is this rank's.
  std::function<Status(Connector& connector, Metrics& metrics)> attention;
  // Runs one FFN rank to completion (e.g. FfnRunner(connector, compute, &metrics).run()).
  std::function<Status(Connector& connector, Metrics& metrics)> ffn;
};

struct JobOptions {
  // Trace events reserved per rank; 0 disables the trace.
  size_t trace_events = 0;
  // When non-empty, world rank 0 writes the Chrome/Perfetto trace of every rank here.
  std::string trace_path;
  // When set, world rank 0 stores the job-wide metrics here (others leave it untouched).
  AfdReport* report = nullptr;
  // This rank's fingerprint, compared across every rank by Connector::init (the same for every thread of an
  // in-process job).
  std::vector<FingerprintItem> fingerprint;
};

// Runs all A + F ranks of `cfg` as threads over the in-process transport and joins them. Returns OK when
// every rank succeeded, otherwise the first failure, naming the failed rank.
Status run_inproc_job(const ValidAfdConfig& cfg, const RankFns& fns, const JobOptions& options = {});
// As above for a config not validated yet (validate()'s error first).
Status run_inproc_job(const AfdConfig& cfg, const RankFns& fns, const JobOptions& options = {});

// Runs this process's rank over MPI. `declared_role` is the role from the command line (MPMD launch) or
// kRoleUndeclared (roles from rank order). Returns OK on success; returns an error when the transport
// cannot start (e.g. not under mpirun), before any rank depends on this one; any later failure ends the
// whole job (does not return).
Status run_mpi_rank(const ValidAfdConfig& cfg, int declared_role, const RankFns& fns, const JobOptions& options = {});
// As above for a config not validated yet (validate()'s error first).
Status run_mpi_rank(const AfdConfig& cfg, int declared_role, const RankFns& fns, const JobOptions& options = {});

// Parses "attention" / "ffn" (the --role argument).
Result<int> parse_role(std::string_view text);

}  // namespace genbridge::afd
