// genbridge make-model: writes a synthetic checkpoint.
#include <fmt/format.h>

#include <chrono>

#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "runtime/model/fp8_checkpoint.h"
#include "runtime/model/synthetic.h"
#include "tools/commands.h"
#include "tools/run_support.h"

namespace genbridge::tools {

int make_model(const MakeModelOptions& o) {
  if (auto env = num_threads_from_env(); !env.ok()) {
    fmt::print(stderr, "genbridge make-model: {}\n", env.status().message());
    return kExitUsage;
  }
  if (auto env = cpu_target_from_env(); !env.ok()) {
    fmt::print(stderr, "genbridge make-model: {}\n", env.status().message());
    return kExitUsage;
  }
  const auto t0 = std::chrono::steady_clock::now();
  fmt::print(stderr, "writing synthetic model '{}' (seed {}, {} shard(s)) to {} ...\n", o.preset, o.seed, o.shards,
             o.out_dir);
  if (o.weight_quant == "fp8" && o.shards != 1) {
    fmt::print(stderr,
               "genbridge make-model: --weight-quant fp8 writes one shard; --shards {} is not supported with it\n",
               o.shards);
    return kExitUsage;
  }
  Status st = model::write_synthetic_checkpoint(o.preset, o.seed, o.out_dir, o.shards);
  if (st.ok() && o.weight_quant == "fp8") st = model::convert_checkpoint_to_fp8(o.out_dir);
  // tokenizer.json + tokenizer_config.json sized to the preset's vocabulary: text in, text out.
  if (st.ok()) st = write_preset_tokenizer(o.preset, o.out_dir);
  if (!st.ok()) {
    fmt::print(stderr, "genbridge make-model: {}\n", st.to_string());
    return kExitFailed;
  }
  fmt::print(stderr, "done in {:.1f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return kExitOk;
}

}  // namespace genbridge::tools
