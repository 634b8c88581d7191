// genbridge make-model: writes a synthetic checkpoint.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "runtime/checkpoint/deepseek_v4_quant.h"
#include "runtime/checkpoint/fp8_checkpoint.h"
#include "text/chat_template.h"
#include "text/synthetic_tokenizer.h"
#include "text/tokenizer.h"
#include "tools/commands.h"
#include "tools/make_model/synthetic.h"
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
  auto config = model::synthetic_preset_config(o.preset);
  if (!config.ok()) {
    fmt::print(stderr, "genbridge make-model: {}\n", config.status().message());
    return kExitUsage;
  }
  if (o.vocab_size > 0) {
    if (o.vocab_size < text::kMinSyntheticVocab && o.tokenizer_dir.empty()) {
      fmt::print(stderr, "genbridge make-model: --vocab-size {}: the synthetic tokenizer needs at least {} tokens\n",
                 o.vocab_size, text::kMinSyntheticVocab);
      return kExitUsage;
    }
    config->vocab_size = o.vocab_size;
  }
  // --tokenizer: checked before anything is written.
  namespace fs = std::filesystem;
  if (!o.tokenizer_dir.empty()) {
    auto tok = text::Tokenizer::load(fs::path(o.tokenizer_dir) / "tokenizer.json");
    if (!tok.ok()) {
      fmt::print(stderr, "genbridge make-model: --tokenizer {}: {}\n", o.tokenizer_dir, tok.status().message());
      return kExitUsage;
    }
    if (tok->vocab_size() > config->vocab_size) {
      fmt::print(stderr,
                 "genbridge make-model: --tokenizer {}: its {} token ids do not fit the model's vocabulary of {}; "
                 "give --vocab-size {} or more\n",
                 o.tokenizer_dir, tok->vocab_size(), config->vocab_size, tok->vocab_size());
      return kExitUsage;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  fmt::print(stderr, "writing synthetic model '{}' (seed {}, {} shard(s), vocabulary {}) to {} ...\n", o.preset,
             o.seed, o.shards, config->vocab_size, o.out_dir);
  if (o.weight_quant == "fp8" && o.shards != 1) {
    fmt::print(stderr,
               "genbridge make-model: --weight-quant fp8 writes one shard; --shards {} is not supported with it\n",
               o.shards);
    return kExitUsage;
  }
  Status st = o.vocab_size > 0
                  ? model::write_synthetic_checkpoint(*config, o.seed, o.out_dir, o.shards, DType::kBF16, o.router_skew)
                  : model::write_synthetic_checkpoint(o.preset, o.seed, o.out_dir, o.shards, o.router_skew);
  // DeepSeek-V4 presets get the form DeepSeek ships (FP8 linears, MXFP4 experts), the others Hugging Face's FP8.
  if (st.ok() && o.weight_quant == "fp8") {
    st = config->is_deepseek_v4() ? model::convert_checkpoint_to_deepseek_v4_fp8(o.out_dir)
                                  : model::convert_checkpoint_to_fp8(o.out_dir);
  }
  // tokenizer.json + tokenizer_config.json sized to the vocabulary (text in, text out), or copied (with a
  // chat_template.jinja beside them).
  if (st.ok() && o.tokenizer_dir.empty()) st = text::write_synthetic_tokenizer(o.out_dir, config->vocab_size);
  if (st.ok() && !o.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", text::kTokenizerConfigFile, text::kChatTemplateFile}) {
      const fs::path from = fs::path(o.tokenizer_dir) / f;
      if (!fs::exists(from)) continue;
      std::error_code ec;
      fs::copy_file(from, fs::path(o.out_dir) / f, fs::copy_options::overwrite_existing, ec);
      if (ec) {
        st = internal_error(fmt::format("copying {}: {}", from.string(), ec.message()));
        break;
      }
    }
  }
  if (!st.ok()) {
    fmt::print(stderr, "genbridge make-model: {}\n", st.to_string());
    return kExitFailed;
  }
  fmt::print(stderr, "done in {:.1f} s\n",
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return kExitOk;
}

}  // namespace genbridge::tools
