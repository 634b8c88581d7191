// One rank of a toy AFD job under mpirun (MPMD: `mpirun -np A prog --role attention ... : -np F prog
// --role ffn ...`, or without --role: roles from rank order). Attention ranks decode their requests
// through the connector and compare tokens and logits with a monolithic run of the same requests, bit
// for bit. Fault injection: an FFN rank can be killed (SIGKILL), hang, or fail its expert compute at a
// given step. Exit status 0 only when every rank verified its results.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "afd/job.h"
#include "afd/runner.h"
#include "afd/support/toy_model.h"

using namespace genbridge;
using namespace genbridge::afd;

namespace {

struct Options {
  int role = kRoleUndeclared;
  std::string topology = "1A1F";
  ConnectorKind connector = ConnectorKind::kSync;
  int stages = 1;
  bool async_dp = false;
  int64_t timeout_ms = 20000;
  int ffn_stages = 0;  // != 0: FFN ranks use this stage count (settings-mismatch test)
  enum class Fault { kNone, kKill, kHang, kFail } fault = Fault::kNone;
  int fault_rank = 0;
  int fault_step = 1;
  std::string trace_path;
  bool report = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "afd_job_mpi: %s\nusage: afd_job_mpi [--role attention|ffn] [--afd 2A1F] [--connector sync|async] "
               "[--stages N] [--async-dp] [--timeout-ms N] [--ffn-stages N] [--kill|--hang|--fail FFN_RANK STEP] "
               "[--trace FILE] [--report]\n",
               why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--role") {
      Result<int> r = parse_role(next());
      if (!r.ok()) usage(r.status().message().c_str());
      o.role = *r;
    } else if (a == "--afd") {
      o.topology = next();
    } else if (a == "--connector") {
      const std::string v = next();
      if (v != "sync" && v != "async") usage("--connector must be sync or async");
      o.connector = v == "sync" ? ConnectorKind::kSync : ConnectorKind::kAsync;
    } else if (a == "--stages") {
      o.stages = std::atoi(next().c_str());
    } else if (a == "--async-dp") {
      o.async_dp = true;
    } else if (a == "--timeout-ms") {
      o.timeout_ms = std::atoll(next().c_str());
    } else if (a == "--ffn-stages") {
      o.ffn_stages = std::atoi(next().c_str());
    } else if (a == "--kill" || a == "--hang" || a == "--fail") {
      o.fault = a == "--kill" ? Options::Fault::kKill : a == "--hang" ? Options::Fault::kHang : Options::Fault::kFail;
      o.fault_rank = std::atoi(next().c_str());
      o.fault_step = std::atoi(next().c_str());
    } else if (a == "--trace") {
      o.trace_path = next();
    } else if (a == "--report") {
      o.report = true;
    } else {
      usage(("unknown argument " + a).c_str());
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  AfdConfig cfg = testing::toy_config(o.connector, 1, 1, o.stages);
  cfg.transport = TransportKind::kMpi;
  cfg.async_dp = o.async_dp;
  cfg.timeout_ms = o.timeout_ms;
  if (Status s = apply_topology_string(o.topology, &cfg); !s.ok()) usage(s.message().c_str());
  if (o.ffn_stages != 0 && o.role == static_cast<int>(Role::kFfn)) cfg.num_stages = o.ffn_stages;
  if (Status s = validate(cfg); !s.ok()) usage(s.message().c_str());

  const testing::ToyModel model(cfg);
  const testing::Workload work;
  const bool lockstep = cfg.connector == ConnectorKind::kSync || !cfg.async_dp;

  RankFns fns;
  fns.attention = [&](Connector& c, Metrics& metrics) -> Status {
    testing::ToyAttention att(model, work, cfg, c.rank());
    AttentionRunner runner(c, &metrics);
    GB_RETURN_IF_ERROR(att.run(runner, lockstep ? work.steps() : 0));
    const testing::Trace want = testing::run_monolithic(model, work, att.requests());
    int64_t tokens = 0;
    for (int r : att.requests()) {
      if (want.tokens[r] != att.trace().tokens[r] || want.logit_bits[r] != att.trace().logit_bits[r]) {
        return internal_error(fmt::format("MISMATCH: request {} on attention rank {} differs from the monolithic run",
                                          r, c.rank()));
      }
      tokens += static_cast<int64_t>(want.tokens[r].size());
    }
    std::printf("attention rank %d: %zu requests, %lld tokens and their logits bit-identical to monolithic (%s, %s, "
                "S=%d)\n",
                c.rank(), att.requests().size(), static_cast<long long>(tokens), std::string(c.name()).c_str(),
                o.topology.c_str(), cfg.num_stages);
    std::fflush(stdout);
    return ok_status();
  };
  fns.ffn = [&](Connector& c, Metrics& metrics) -> Status {
    ExpertComputeFn compute = testing::toy_expert_compute(model);
    if (o.fault != Options::Fault::kNone && c.rank() == o.fault_rank) {
      compute = [&, inner = std::move(compute)](const FfnWorkItem& item) -> Status {
        if (item.meta.step >= o.fault_step) {
          switch (o.fault) {
            case Options::Fault::kKill:
              std::fprintf(stderr, "afd_job_mpi: killing ffn rank %d (pid %d) at step %lld, layer %d\n", c.rank(),
                           static_cast<int>(getpid()), static_cast<long long>(item.meta.step), item.meta.layer);
              std::fflush(stderr);
              raise(SIGKILL);
              break;
            case Options::Fault::kHang:
              std::fprintf(stderr, "afd_job_mpi: ffn rank %d stops responding at step %lld\n", c.rank(),
                           static_cast<long long>(item.meta.step));
              std::fflush(stderr);
              for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
            case Options::Fault::kFail:
              return internal_error("injected failure in the expert compute");
            case Options::Fault::kNone:
              break;
          }
        }
        return inner(item);
      };
    }
    return FfnRunner(c, std::move(compute), &metrics).run();
  };

  AfdReport report;
  JobOptions jo;
  jo.trace_path = o.trace_path;
  jo.trace_events = o.trace_path.empty() ? 0 : 100000;
  if (o.report) jo.report = &report;
  const Status s = run_mpi_rank(cfg, o.role, fns, jo);
  if (!s.ok()) {
    std::fprintf(stderr, "afd_job_mpi: %s\n", s.to_string().c_str());
    return 1;
  }
  if (o.report && report.num_ranks > 0) std::printf("%s%s\n", report_text(report).c_str(), report_json(report).c_str());
  return 0;
}
