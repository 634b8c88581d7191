// Model loading costs: writing synthetic checkpoints, opening a bf16 checkpoint (zero-copy: mmap, header
// parsing, binding; populate on and off, page cache warm), converting an f32 checkpoint to bf16 at open,
// reading it into memory (--no-mmap) and scanning every weight for NaN / Inf (--check-weights); the last
// three are memory-bound and reported against the cold copy roof (bench/support/bench_util.h; weights are
// hundreds of MB, larger than the LLC).
#include <benchmark/benchmark.h>

#include <memory>

#include "runtime/checkpoint/checkpoint.h"
#include "support/bench_util.h"
#include "support/temp_dir.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::bench {
namespace {

using model::Checkpoint;
using model::LoadOptions;

// One checkpoint per name, written on first use and kept for the whole run.
const std::filesystem::path& checkpoint_dir(const std::string& preset, DType dtype = DType::kBF16, int64_t layers = 0) {
  static std::map<std::string, std::unique_ptr<testing::TempDir>> dirs;
  const std::string key = preset + "/" + std::string(dtype_name(dtype)) + "/" + std::to_string(layers);
  auto& d = dirs[key];
  if (!d) {
    d = std::make_unique<testing::TempDir>();
    model::ModelConfig c = model::synthetic_preset_config(preset).value();
    if (layers > 0) c.num_hidden_layers = layers;
    if (!model::write_synthetic_checkpoint(c, 0, d->path(), 1, dtype).ok()) std::abort();
  }
  return d->path();
}

void BM_write_synthetic_tiny(benchmark::State& state) {
  testing::TempDir dir;
  for (auto _ : state) {
    if (!model::write_synthetic_checkpoint("tiny", 0, dir.path()).ok()) state.SkipWithError("write failed");
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(model::model_weight_bytes(
                                                   model::synthetic_preset_config("tiny").value())));
}
BENCHMARK(BM_write_synthetic_tiny)->Unit(benchmark::kMillisecond);

void BM_open_bf16(benchmark::State& state, const std::string& preset, bool populate) {
  const std::filesystem::path& dir = checkpoint_dir(preset);
  for (auto _ : state) {
    Result<Checkpoint> ck = Checkpoint::open(dir, LoadOptions{.populate = populate});
    if (!ck.ok()) state.SkipWithError(ck.status().message().c_str());
    benchmark::DoNotOptimize(ck->weights().lm_head.data());
  }
}
BENCHMARK_CAPTURE(BM_open_bf16, tiny_populate, std::string("tiny"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_open_bf16, small_populate, std::string("small"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_open_bf16, small_lazy, std::string("small"), false)->Unit(benchmark::kMillisecond);

// f32 -> bf16 at open: bytes moved = 4 read + 2 written per weight.
void BM_open_f32_to_bf16(benchmark::State& state) {
  const std::filesystem::path& dir = checkpoint_dir("small", DType::kF32, 1);
  const model::ModelConfig c = Checkpoint::open(dir, {.precision = model::WeightPrecision::kNative}).value().config();
  const size_t bytes = model::model_weight_bytes(c, DType::kF32) + model::model_weight_bytes(c, DType::kBF16);
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = true}, [&](int64_t) {
    Result<Checkpoint> ck = Checkpoint::open(dir);
    if (!ck.ok()) state.SkipWithError(ck.status().message().c_str());
    benchmark::DoNotOptimize(ck->weights().lm_head.data());
  });
}
BENCHMARK(BM_open_f32_to_bf16)->UseManualTime()->Unit(benchmark::kMillisecond);

// --no-mmap: open reads every file into memory (page cache -> owned buffer: bytes moved = 2 x weights).
void BM_open_no_mmap(benchmark::State& state) {
  const std::filesystem::path& dir = checkpoint_dir("small");
  const size_t bytes = 2 * model::model_weight_bytes(model::synthetic_preset_config("small").value());
  run_roofline(state, Work{.bytes = static_cast<double>(bytes), .cold = true}, [&](int64_t) {
    Result<Checkpoint> ck = Checkpoint::open(dir, LoadOptions{.use_mmap = false});
    if (!ck.ok()) state.SkipWithError(ck.status().message().c_str());
    benchmark::DoNotOptimize(ck->weights().lm_head.data());
  });
}
BENCHMARK(BM_open_no_mmap)->UseManualTime()->Unit(benchmark::kMillisecond);

// --check-weights: every weight byte read once (bytes moved = weight bytes, all reads), populated mapping.
void BM_check_finite(benchmark::State& state) {
  const Checkpoint ck = Checkpoint::open(checkpoint_dir("small")).value();
  run_roofline(state,
               Work{.bytes = static_cast<double>(ck.mapped_weight_bytes() + ck.converted_weight_bytes()),
                    .cold = true,
                    .read_roof = true},
               [&](int64_t) {
                 if (!ck.check_finite().ok()) state.SkipWithError("non-finite weight");
               });
}
BENCHMARK(BM_check_finite)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace genbridge::bench
