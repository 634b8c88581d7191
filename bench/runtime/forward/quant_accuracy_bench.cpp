// Accuracy of quantized weights against the bf16 engine (docs/bench/quant_weights.md): for each
// scheme this build's generation runs, on a synthetic preset, logits relative L2 per step (median, p99,
// max) and greedy token agreement with the bf16 engine over N teacher-forced decode steps.
//   bench.runtime.forward.quant_accuracy_bench [preset=small] [steps=256]
// Not a Google Benchmark: it prints one table.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "runtime/device/device_operator.h"
#include "runtime/engine/sampler.h"
#include "support/quant_accuracy.h"
#include "tools/make_model/synthetic.h"

int main(int argc, char** argv) {
  using namespace genbridge;
  const std::string preset = argc > 1 ? argv[1] : "small";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 256;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("gb_quant_acc_" + preset);
  if (!std::filesystem::exists(dir / "config.json")) {
    if (auto s = model::write_synthetic_checkpoint(preset, 0, dir); !s.ok()) {
      fmt::print(stderr, "{}\n", s.to_string());
      return 1;
    }
  }
  auto ckpt = model::Checkpoint::open(dir);
  if (!ckpt.ok()) {
    fmt::print(stderr, "{}\n", ckpt.status().to_string());
    return 1;
  }
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) {
    prompt.push_back(
        static_cast<int32_t>(engine::uniform_from(2026, i) * static_cast<double>(ckpt->config().vocab_size)));
  }
  fmt::print("preset {}, prompt 16 tokens, {} teacher-forced greedy steps (+ prefill)\n", preset, steps);
  fmt::print("{:<22} {:>12} {:>12} {:>12} {:>10} {:>10} {:>12}\n", "scheme", "relL2 med", "relL2 p99", "relL2 max",
             "agree", "bytes", "quantize s");
  // The error split by role: every quantized role, the attention projections alone, the FFN side alone
  // (routed and shared experts, dense MLPs).
  const runtime::QuantizedLayers all = runtime::DeviceOperator::create({}).value().contract().weight_quant.layers;
  runtime::QuantizedLayers attention_only = all, experts_only = all;
  attention_only.experts = attention_only.shared_experts = false;
  experts_only.attention_projections = false;
  struct Row {
    const char* label;
    const runtime::QuantizedLayers* roles;
  };
  for (const char* s : {"w8a8", "mxfp8", "mxfp4"}) {
    for (Row row : {Row{"", &all}, Row{" attn proj. only", &attention_only}, Row{" FFN only", &experts_only}}) {
      auto acc = testing::measure_quant_accuracy(*ckpt, s, prompt, steps, row.roles);
      if (!acc.ok()) {
        fmt::print("{:<7} not run: {}\n", s, acc.status().message());
        break;
      }
      fmt::print("{:<22} {:>12.3e} {:>12.3e} {:>12.3e} {:>9.1f}% {:>9.3f}x {:>12.2f}\n", std::string(s) + row.label,
                 acc->quantile(0.5), acc->quantile(0.99), acc->quantile(1.0), 100 * acc->agreement(),
                 static_cast<double>(acc->quantized_bytes) / static_cast<double>(acc->replaced_bytes),
                 acc->quantize_seconds);
    }
  }
  return 0;
}
