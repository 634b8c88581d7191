// One rank of a real-engine AFD job under mpirun (MPMD with --role, or roles from rank order), through
// afd::run_mpi_engine_rank (what `genbridge afd-worker` runs). World rank 0 then runs the monolithic
// engine in-process on the same checkpoint and requests and compares every token and every logit bit;
// any difference prints MISMATCH and exits 1. Fault injection: an FFN rank can be killed (SIGKILL) or
// fail its expert compute at a given step; an attention rank can stop (SIGSTOP, as `kill -STOP` does)
// before a given step (0: before the job starts, i.e. before MPI_Init). Exit status 0 only when rank 0
// verified every result.

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "afd/engine_job.h"
#include "afd/job.h"
#include "runtime/engine/assembly.h"

using namespace genbridge;
using namespace genbridge::afd;

namespace {

struct Options {
  int role = kRoleUndeclared;
  std::string model_dir;
  std::string topology = "1A1F";
  ConnectorKind connector = ConnectorKind::kSync;
  int stages = 1;
  int64_t timeout_ms = 20000;
  int64_t init_timeout_ms = 0;  // 0: the config's default
  bool extra_request = false;   // this process adds a 6th request (ranks disagree on the requests)
  bool long_prompts = false;    // prompts of 60..140 tokens (past a gated-delta-rule chunk and a KV page)
  std::string moe_dispatch = "bf16";  // --moe-dispatch: bf16 | quantized (AFD and the monolithic engine alike)
  enum class Fault { kNone, kKill, kFail, kStop } fault = Fault::kNone;
  int fault_rank = 0;
  int fault_step = 1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(
      stderr,
      "afd_engine_mpi: %s\nusage: afd_engine_mpi --model DIR [--role attention|ffn] [--afd 2A1F] "
      "[--connector sync|async] [--stages N] [--timeout-ms N] [--init-timeout-ms N] [--extra-request] [--long-prompts] "
      "[--moe-dispatch bf16|quantized] "
      "[--kill|--fail FFN_RANK STEP] "
      "[--stop ATTENTION_RANK STEP]\n",
      why.c_str());
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value after " + a);
      return argv[++i];
    };
    if (a == "--role") {
      Result<int> r = parse_role(next());
      if (!r.ok()) usage(r.status().message());
      o.role = *r;
    } else if (a == "--model") {
      o.model_dir = next();
    } else if (a == "--afd") {
      o.topology = next();
    } else if (a == "--connector") {
      const std::string v = next();
      if (v != "sync" && v != "async") usage("--connector must be sync or async");
      o.connector = v == "sync" ? ConnectorKind::kSync : ConnectorKind::kAsync;
    } else if (a == "--stages") {
      o.stages = std::atoi(next().c_str());
    } else if (a == "--timeout-ms") {
      o.timeout_ms = std::atoll(next().c_str());
    } else if (a == "--extra-request") {
      o.extra_request = true;
    } else if (a == "--long-prompts") {
      o.long_prompts = true;
    } else if (a == "--moe-dispatch") {
      o.moe_dispatch = next();
    } else if (a == "--init-timeout-ms") {
      o.init_timeout_ms = std::atoll(next().c_str());
    } else if (a == "--kill" || a == "--fail" || a == "--stop") {
      o.fault = a == "--kill" ? Options::Fault::kKill : a == "--fail" ? Options::Fault::kFail : Options::Fault::kStop;
      o.fault_rank = std::atoi(next().c_str());
      o.fault_step = std::atoi(next().c_str());
    } else {
      usage("unknown argument " + a);
    }
  }
  if (o.model_dir.empty()) usage("--model is required");
  return o;
}

// Requests of different lengths that finish at different steps (so lockstep ranks idle at the end).
std::vector<engine::Request> requests(int64_t vocab, bool long_prompts) {
  std::vector<engine::Request> reqs;
  for (int r = 0; r < 5; ++r) {
    engine::Request q;
    q.id = r;
    for (int i = 0; i < (long_prompts ? 60 + 20 * r : 4 + 3 * r); ++i) {
      q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(77 + r, i) * static_cast<double>(vocab)));
    }
    q.max_new_tokens = 3 + r % 3;
    reqs.push_back(q);
  }
  return reqs;
}

constexpr int64_t kPagesPerRank = 16;

Result<std::vector<engine::RequestResult>> monolithic(const model::Checkpoint& ckpt, const runtime::DeviceOperator& dev,
                                                      const engine::EngineOptions& options, bool long_prompts) {
  // The same assembly as an attention rank's: kPagesPerRank pages, one state slot per sequence run at once
  // (for a model with linear-attention state).
  GB_ASSIGN_OR_RETURN(std::unique_ptr<engine::AssembledEngine> assembled,
                      engine::assemble_engine(ckpt, dev, kPagesPerRank,
                                              {.engine = options, .kv_pool = {.state_slots = options.max_batch}}, {}));
  for (auto& r : requests(ckpt.config().vocab_size, long_prompts)) GB_RETURN_IF_ERROR(assembled->engine->submit(r));
  GB_RETURN_IF_ERROR(assembled->engine->run_to_completion());
  return assembled->engine->results();
}

}  // namespace

[[maybe_unused]] void stop_self(const char* where) {
  std::fprintf(stderr, "afd_engine_mpi: stopping (SIGSTOP) pid %d %s\n", static_cast<int>(getpid()), where);
  std::fflush(stderr);
  raise(SIGSTOP);
}

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  // Attention ranks are world ranks 0..A-1 in both launches (rank order, and MPMD with attention first).
  const char* world = std::getenv("OMPI_COMM_WORLD_RANK");
  if (o.fault == Options::Fault::kStop && o.fault_step == 0 && world && std::atoi(world) == o.fault_rank) {
    stop_self(fmt::format("as attention rank {}, before the job starts", o.fault_rank).c_str());
  }
  auto die = [](const Status& s) {
    std::fprintf(stderr, "afd_engine_mpi: %s\n", s.to_string().c_str());
    return 1;
  };
  auto ckpt = model::Checkpoint::open(o.model_dir);
  if (!ckpt.ok()) return die(ckpt.status());
  runtime::DeviceConfig dc;
  dc.moe_dispatch = o.moe_dispatch;
  auto dev = runtime::DeviceOperator::create(dc);
  if (!dev.ok()) return die(dev.status());

  EngineJobOptions jo;
  if (Status s = apply_topology_string(o.topology, &jo.afd); !s.ok()) usage(s.message());
  jo.afd.connector = o.connector;
  jo.afd.async_dp = o.connector == ConnectorKind::kAsync;
  jo.afd.num_stages = o.stages;
  jo.afd.timeout_ms = o.timeout_ms;
  if (o.init_timeout_ms > 0) jo.afd.init_timeout_ms = o.init_timeout_ms;
  jo.engine.record_logits = true;
  if (o.fault == Options::Fault::kStop) {
    jo.attention_hook = [&o](int attention_rank, int64_t step) -> Status {
      if (attention_rank == o.fault_rank && step == o.fault_step) {
        stop_self(fmt::format("as attention rank {}, before step {}", attention_rank, step).c_str());
      }
      return ok_status();
    };
  } else if (o.fault != Options::Fault::kNone) {
    jo.ffn_hook = [&o](int ffn_rank, const FfnWorkItem& item) -> Status {
      if (ffn_rank != o.fault_rank || item.meta.step < o.fault_step) return ok_status();
      if (o.fault == Options::Fault::kKill) {
        std::fprintf(stderr, "afd_engine_mpi: killing ffn rank %d (pid %d) at step %lld, layer %d\n", ffn_rank,
                     static_cast<int>(getpid()), static_cast<long long>(item.meta.step), item.meta.layer);
        std::fflush(stderr);
        raise(SIGKILL);
      }
      return internal_error("injected failure in the expert compute");
    };
  }

  std::vector<engine::Request> reqs = requests(ckpt->config().vocab_size, o.long_prompts);
  if (o.extra_request) {
    reqs.push_back(reqs.back());
    reqs.back().id = static_cast<int64_t>(reqs.size()) - 1;
  }
  auto job = run_mpi_engine_rank(*ckpt, *dev, std::move(reqs), kPagesPerRank, jo, o.role);
  if (!job.ok()) return die(job.status());
  if (job->num_ranks == 0) return 0;  // not world rank 0

  auto want = monolithic(*ckpt, *dev, jo.engine, o.long_prompts);
  if (!want.ok()) return die(want.status());
  if (want->size() != job->results.size()) {
    std::printf("MISMATCH: %zu AFD results, %zu monolithic\n", job->results.size(), want->size());
    return 1;
  }
  int64_t tokens = 0, logits = 0;
  for (size_t r = 0; r < want->size(); ++r) {
    const engine::RequestResult &w = (*want)[r], &g = job->results[r];
    const bool same_logits = w.logits.size() == g.logits.size() &&
                             std::memcmp(w.logits.data(), g.logits.data(), w.logits.size() * sizeof(float)) == 0;
    if (w.id != g.id || w.tokens != g.tokens || !same_logits || g.logits.empty()) {
      std::printf("MISMATCH: request %zu: AFD tokens [%s] vs monolithic [%s]; logits %s\n", r,
                  fmt::format("{}", fmt::join(g.tokens, " ")).c_str(),
                  fmt::format("{}", fmt::join(w.tokens, " ")).c_str(), same_logits ? "equal" : "differ");
      return 1;
    }
    tokens += static_cast<int64_t>(w.tokens.size());
    logits += static_cast<int64_t>(w.logits.size());
  }
  std::printf(
      "all %zu requests: %lld tokens and %lld logits bit-identical to the monolithic engine (%s connector, "
      "%s, S=%d, %d ranks, %s MoE dispatch)\n",
      want->size(), static_cast<long long>(tokens), static_cast<long long>(logits),
      std::string(connector_kind_name(o.connector)).c_str(), o.topology.c_str(), o.stages, job->num_ranks,
      o.moe_dispatch.c_str());
  return 0;
}
