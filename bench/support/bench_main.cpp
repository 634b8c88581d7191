// main() of every Google Benchmark executable here: refuses an invalid GENBRIDGE_CPU_TARGET before anything
// runs, then records what the numbers depend on in the benchmark context (printed at the top of the console
// output and stored in --benchmark_out JSON): the CPU model, the CPU target the kernels run on, the thread
// count, the last-level cache size and the load average at start. Each row also carries `load` at its end.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <string>

#include "genbridge/build_info.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "support/bench_util.h"

int main(int argc, char** argv) {
  using namespace genbridge;
  if (auto env = cpu_target_from_env(); !env.ok()) {
    std::fprintf(stderr, "%s\n", env.status().message().c_str());
    return 2;
  }
  if (auto threads = num_threads_from_env(); !threads.ok()) {
    std::fprintf(stderr, "%s\n", threads.status().message().c_str());
    return 2;
  }
  benchmark::AddCustomContext("cpu_model", bench::cpu_model_name());
  benchmark::AddCustomContext("cpu_target", cpu_target());
  std::string avail;
  for (const std::string& t : cpu_targets_available()) avail += (avail.empty() ? "" : " ") + t;
  benchmark::AddCustomContext("cpu_targets_available", avail);
  benchmark::AddCustomContext("threads", std::to_string(num_threads()));
  benchmark::AddCustomContext("llc_bytes", std::to_string(bench::llc_bytes()));
  benchmark::AddCustomContext("load_avg_at_start", std::to_string(bench::load_average()));
  benchmark::AddCustomContext("provider_target", std::string(ops::build_target()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
