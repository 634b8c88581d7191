#pragma once
// Shared pieces of `genbridge run` (monolithic and AFD): model resolution, pool sizing, progress and
// result printing.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "afd/config.h"
#include "genbridge/core/status.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/engine.h"
#include "runtime/memory/kv_page_pool.h"
#include "runtime/model/checkpoint.h"
#include "tools/commands.h"

namespace genbridge::tools {

// The DeviceOperator for --soc (else GENBRIDGE_SOC) and --kv-cache-dtype; prints its contract line to stderr
// when `log` and not --quiet.
Result<runtime::DeviceOperator> make_device(const RunOptions& o, bool log = true);
// The model directory: --model, or the cached synthetic model of --preset (built on first use).
Result<std::filesystem::path> resolve_model_dir(const RunOptions& o);
// Where the cached synthetic model of --preset / --model-seed lives (built or not).
std::filesystem::path synthetic_model_dir(const RunOptions& o);
// The AFD settings of --afd, --afd-connector, --afd-stages, --afd-timeout. `mpi`: for `afd-worker`
// (--afd-transport must be mpi); otherwise for `run` (it must be inproc).
Result<afd::AfdConfig> afd_config_from(const RunOptions& o, bool mpi);
// The requests of a run: explicit --prompt ids or deterministic generated prompts.
Result<std::vector<engine::Request>> make_requests(const RunOptions& o, int64_t vocab);
// Checkpoint::open of `dir` with --no-mmap; with --check-weights also scans every weight (refusing a
// non-finite one) and prints the scan's cost to stderr. `populate`: LoadOptions::populate.
Result<model::Checkpoint> open_checkpoint(const std::filesystem::path& dir, const RunOptions& o, bool populate = true);
// One line: architecture, sizes, norm type, weights.
std::string describe_model(const model::Checkpoint& ckpt);
// A pool in the DeviceOperator's representation: kv_memory_mb MiB, or (0) enough pages for every request.
Result<runtime::KvPagePool> make_pool(const runtime::DeviceOperator& dev, const model::ModelConfig& cfg,
                                      const std::vector<engine::Request>& reqs, int64_t kv_memory_mb);
void print_results(const std::vector<engine::RequestResult>& results);
// `num_ranks`: devices the throughput is divided by (AFD counts every rank).
void print_metrics(const engine::EngineMetrics& m, const runtime::DeviceOperator& dev, const model::ModelConfig& cfg,
                   int64_t num_requests, int num_ranks);
Status dump_logits(const std::string& path, const std::vector<engine::RequestResult>& results, int64_t vocab);
int run_afd(const RunOptions& o);

// Single-line progress on stderr (only when stderr is a terminal, or always with a final newline otherwise).
class ProgressPrinter {
 public:
  explicit ProgressPrinter(bool quiet);
  void update(const engine::Progress& p);
  void clear();

 private:
  bool quiet_, tty_;
  double start_, last_print_ = -1;
  bool printed_ = false;
};

}  // namespace genbridge::tools
