// Accuracy of quantized weights against the bf16 engine (docs/bench/quant_weights.md): for each
// scheme this build's generation runs, on a synthetic preset, logits relative L2 per step (median, p99,
// max) and greedy token agreement with the bf16 engine over N teacher-forced decode steps.
//   bench.runtime.forward.quant_accuracy_bench [preset=small] [steps=256] [form=bf16|fp8]
// form fp8 converts the checkpoint as make-model --weight-quant fp8 does (a DeepSeek-V4 preset: DeepSeek's FP8 +
// MXFP4 form) and adds an "auto" row; the bf16 engine then runs the checkpoint's bf16 dequantization.
// Not a Google Benchmark: it prints one table.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/checkpoint/fp8_checkpoint.h"
#include "runtime/device/device_operator.h"
#include "runtime/engine/sampler.h"
#include "support/quant_accuracy.h"
#include "tools/make_model/synthetic.h"

int main(int argc, char** argv) {
  using namespace genbridge;
  const std::string preset = argc > 1 ? argv[1] : "small";
  const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 256;
  const std::string form = argc > 3 ? argv[3] : "bf16";
  if (form != "bf16" && form != "fp8") {
    fmt::print(stderr, "form '{}' is not bf16 or fp8\n", form);
    return 2;
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("gb_quant_acc_" + preset + (form == "fp8" ? "_fp8" : ""));
  if (!std::filesystem::exists(dir / "config.json")) {
    Status s = model::write_synthetic_checkpoint(preset, 0, dir);
    if (s.ok() && form == "fp8") {
      const bool v4 = model::synthetic_preset_config(preset).value().is_deepseek_v4();
      s = v4 ? model::convert_checkpoint_to_deepseek_v4_fp8(dir) : model::convert_checkpoint_to_fp8(dir);
    }
    if (!s.ok()) {
      fmt::print(stderr, "{}\n", s.to_string());
      std::filesystem::remove_all(dir);
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
  fmt::print("preset {} ({} form), prompt 16 tokens, {} teacher-forced greedy steps (+ prefill)\n", preset, form,
             steps);
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
  std::vector<const char*> schemes = {"w8a8", "mxfp8", "mxfp4"};
  if (form == "fp8") schemes.insert(schemes.begin(), "auto");
  for (const char* s : schemes) {
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
