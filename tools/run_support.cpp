#include "tools/run_support.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <type_traits>

#include "afd/rank_job.h"
#include "afd/transport.h"
#include "genbridge/core/cpu_target.h"
#include "genbridge/core/threading.h"
#include "runtime/engine/npy.h"
#include "runtime/engine/sampler.h"
#include "text/synthetic_tokenizer.h"
#include "tools/flags.h"
#include "tools/make_model/synthetic.h"

namespace genbridge::tools {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::filesystem::path cache_root() {
  if (const char* d = std::getenv("GENBRIDGE_CACHE_DIR")) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::filesystem::path(x) / "genbridge";
  if (const char* h = std::getenv("HOME")) return std::filesystem::path(h) / ".cache" / "genbridge";
  return std::filesystem::temp_directory_path() / "genbridge-cache";
}

// Under mpirun, only world rank 0 writes the output files; other ranks (maybe on other nodes) do not
// check their paths. Open MPI names the world rank in the environment before MPI_Init.
bool writes_outputs(RunMode mode) {
  if (mode != RunMode::kAfdMpi) return true;
  return afd::launcher_world_rank() <= 0;
}

}  // namespace

const char* run_command_name(RunMode mode) { return mode == RunMode::kAfdMpi ? "afd-worker" : "run"; }

Result<afd::AfdConfig> afd_config_from(const RunOptions& o, RunMode mode) {
  GB_ASSIGN_OR_RETURN(afd::AfdConfig cfg, parse_afd_flags(o.afd, o.afd_connector, o.afd_stages, o.afd_timeout_s));
  const bool mpi = mode == RunMode::kAfdMpi;
  if (mpi && o.afd_transport != "mpi") {
    return invalid_argument(fmt::format(
        "--afd-transport {}: `genbridge afd-worker` is one process of an mpirun job (mpi); for the in-process "
        "transport use `genbridge run --afd`",
        o.afd_transport));
  }
  if (!mpi && o.afd_transport != "inproc") {
    return invalid_argument(fmt::format(
        "--afd-transport {}: `genbridge run` runs every rank in this process (inproc); for MPI launch ranks with "
        "mpirun and `genbridge afd-worker` (see docs/afd_mpi.md)",
        o.afd_transport));
  }
  cfg.transport = mpi ? afd::TransportKind::kMpi : afd::TransportKind::kInproc;
  cfg.redundant_experts = o.afd_redundant_experts;
  cfg.link_latency_us = o.afd_link_latency_us;
  cfg.link_bandwidth_mbps = std::llround(o.afd_link_gbps * 1000.0);
  if (o.afd_link_gbps > 0 && cfg.link_bandwidth_mbps == 0) {
    return invalid_argument(fmt::format(
        "--afd-link-gbps {}: below the model's resolution of 0.001 Gb/s (1 Mb/s); 0 means unlimited", o.afd_link_gbps));
  }
  return cfg;
}

Result<std::optional<afd::ExpertLoad>> expert_load_from(const RunOptions& o) {
  if (o.afd_expert_load.empty()) {
    if (o.afd_redundant_experts > 0) {
      return invalid_argument(fmt::format(
          "--afd-redundant-experts {} needs --afd-expert-load FILE: the copies go to the experts a measured load "
          "shows hottest (write one with genbridge run --afd ... --afd-expert-load-out FILE)",
          o.afd_redundant_experts));
    }
    return std::optional<afd::ExpertLoad>();
  }
  if (o.afd_redundant_experts == 0) {
    return invalid_argument(fmt::format(
        "--afd-expert-load {} places redundant experts; give --afd-redundant-experts N (N > 0) or drop it",
        o.afd_expert_load));
  }
  GB_ASSIGN_OR_RETURN(afd::ExpertLoad load, afd::read_expert_load(o.afd_expert_load));
  return std::optional<afd::ExpertLoad>(std::move(load));
}

std::string describe_redundant_experts(const RunOptions& o) {
  if (o.afd_redundant_experts == 0) return std::string();
  return fmt::format(", {} redundant experts per MoE layer placed from {}", o.afd_redundant_experts,
                     o.afd_expert_load);
}

Status check_run_flags(const RunOptions& o, RunMode mode) {
  auto given = [&](const char* flag) { return o.given.count(flag) > 0; };
  // A flag that would be ignored is an error: the user meant something by it.
  if (!o.model_dir.empty()) {
    for (const char* f : {"--preset", "--model-seed"}) {
      if (given(f)) {
        return invalid_argument(fmt::format(
            "{} chooses the synthetic model, which is not used with --model {}; drop one of them", f, o.model_dir));
      }
    }
  }
  if (o.enable_prefix_caching && given("--enable-prefix-caching") && !o.dump_choices.empty()) {
    return invalid_argument(
        "--enable-prefix-caching and --dump-choices: a cached prefix's routing is not computed again, so the dump "
        "would miss it; drop one of them");
  }
  if (given("--max-num-seqs") && given("--max-batch")) {
    return invalid_argument("--max-num-seqs is --max-batch under vLLM's name; give one of them");
  }
  if (!o.prompts.empty() && !o.prompt_texts.empty()) {
    return invalid_argument("--prompt and --prompt-text both give the prompts; use one of them");
  }
  if (has_explicit_prompts(o)) {
    const char* source = o.prompts.empty() ? "--prompt-text" : "--prompt";
    for (const char* f : {"--num-prompts", "--prompt-len"}) {
      if (given(f)) {
        return invalid_argument(
            fmt::format("{} shapes the generated prompts, which are not used with {}; drop one of them", f, source));
      }
    }
    const size_t n = o.prompts.size() + o.prompt_texts.size();
    if (n > 4096) return invalid_argument(fmt::format("{} is given {} times; at most 4096 prompts", source, n));
  }
  if (o.afd.empty()) {
    if (mode == RunMode::kAfdMpi) {
      return invalid_argument("--afd is required: the job's topology, e.g. 2A1F (2 attention ranks, 1 FFN rank)");
    }
    for (const std::string& f : o.given) {
      if (f.starts_with("--afd-")) {
        return invalid_argument(
            fmt::format("{} applies to AFD runs only; add --afd (the topology, e.g. 2A1F) or drop {}", f, f));
      }
    }
  } else {
    GB_RETURN_IF_ERROR(afd_config_from(o, mode).status());
    GB_RETURN_IF_ERROR(expert_load_from(o).status());
    if (!o.afd_expert_load_out.empty() && writes_outputs(mode)) {
      GB_RETURN_IF_ERROR(engine::check_output_path("--afd-expert-load-out", o.afd_expert_load_out));
    }
  }
  GB_RETURN_IF_ERROR(num_threads_from_env().status());
  GB_RETURN_IF_ERROR(cpu_target_from_env().status());
  if (const int64_t budget_mb = kv_pool_options(o, 1, 1).memory_mb; budget_mb > 0) {
    const int64_t phys_mib = engine::physical_memory_bytes() >> 20;
    if (phys_mib > 0 && budget_mb > phys_mib) {
      return invalid_argument(
          fmt::format("--kv-memory-mb {}: more than this machine's physical memory ({} MiB)", budget_mb, phys_mib));
    }
  }
  if (writes_outputs(mode)) {
    if (!o.dump_logits.empty()) GB_RETURN_IF_ERROR(engine::check_output_path("--dump-logits", o.dump_logits));
    if (!o.trace.empty()) GB_RETURN_IF_ERROR(engine::check_output_path("--trace", o.trace));
    if (!o.dump_choices.empty()) GB_RETURN_IF_ERROR(engine::check_output_path("--dump-choices", o.dump_choices));
    // Every pair of output files must differ (in the order the flags are listed here).
    const std::pair<const char*, const std::string*> outputs[] = {
        {"--trace", &o.trace}, {"--dump-logits", &o.dump_logits}, {"--dump-choices", &o.dump_choices}};
    for (size_t i = 0; i < std::size(outputs); ++i) {
      for (size_t j = i + 1; j < std::size(outputs); ++j) {
        const std::string &a = *outputs[i].second, &b = *outputs[j].second;
        if (!a.empty() && !b.empty() &&
            std::filesystem::absolute(a).lexically_normal() == std::filesystem::absolute(b).lexically_normal()) {
          return invalid_argument(
              fmt::format("{} {} and {} {} name the same file", outputs[i].first, a, outputs[j].first, b));
        }
      }
    }
  }
  return ok_status();
}

Status check_engine_flags_against_model(const RunOptions& o, const model::ModelConfig& cfg) {
  // Asked for (it is on by default, and then simply off where it cannot be).
  if (o.enable_prefix_caching && o.given.count("--enable-prefix-caching") > 0 &&
      (cfg.is_qwen35() || cfg.is_deepseek_v4())) {
    return invalid_argument(fmt::format(
        "--enable-prefix-caching: {} keeps per-sequence state ({}) that a cached KV page does not hold; drop the flag",
        cfg.is_qwen35() ? "this Qwen3.5 model" : "this DeepSeek-V4 model",
        cfg.is_qwen35() ? "Gated DeltaNet's" : "the sliding window's and the compressors'"));
  }
  return ok_status();
}

Status check_run_flags_against_model(const RunOptions& o, RunMode mode, const model::ModelConfig& cfg) {
  const int64_t vocab = cfg.vocab_size, max_pos = cfg.max_position_embeddings;
  const auto& prompts = explicit_prompt_tokens(o);
  for (size_t p = 0; p < prompts.size(); ++p) {
    // The prompt as typed: --prompt 1,2,3 or --prompt-text "hello" (JSON-quoted: one line whatever the text).
    const std::string typed =
        o.prompts.empty() ? "--prompt-text " + json_quoted(o.prompt_texts[p]) : "--prompt " + o.prompts[p];
    for (int32_t t : prompts[p]) {
      if (t >= vocab) {
        return invalid_argument(fmt::format("{}: token {} is outside the model's vocabulary [0, {})", typed, t, vocab));
      }
    }
    const int64_t total = static_cast<int64_t>(prompts[p].size()) + o.max_new_tokens;
    if (total > max_pos) {
      return invalid_argument(fmt::format(
          "{} ({} tokens) + --max-new-tokens {} = {} tokens exceeds the model's max_position_embeddings ({})", typed,
          prompts[p].size(), o.max_new_tokens, total, max_pos));
    }
  }
  GB_RETURN_IF_ERROR(check_engine_flags_against_model(o, cfg));
  if (!has_explicit_prompts(o) && int64_t{o.prompt_len} + o.max_new_tokens > max_pos) {
    return invalid_argument(fmt::format(
        "--prompt-len {} + --max-new-tokens {} = {} tokens exceeds the model's max_position_embeddings ({})",
        o.prompt_len, o.max_new_tokens, int64_t{o.prompt_len} + o.max_new_tokens, max_pos));
  }
  for (int32_t t : o.stop_tokens) {
    if (t >= vocab) {
      return invalid_argument(
          fmt::format("--stop-token {}: expected a token id in [0, {}) (the model's vocabulary)", t, vocab));
    }
  }
  if (mode != RunMode::kMonolithic) {
    GB_ASSIGN_OR_RETURN(const afd::AfdConfig a, afd_config_from(o, mode));
    if (cfg.num_experts == 0) {
      return invalid_argument(
          fmt::format("--afd {}: the model has no MoE layer, so there is nothing for FFN ranks to do", o.afd));
    }
    if (cfg.num_experts % a.num_ffn != 0) {
      return invalid_argument(fmt::format("--afd {}: the model's {} experts cannot be split evenly over {} FFN ranks",
                                          o.afd, cfg.num_experts, a.num_ffn));
    }
    // The copies are planned against the model's layers and experts: a load measured on another model is refused
    // here, before the weights load. (The link model's budget is checked by the job, with its real transfer sizes.)
    GB_ASSIGN_OR_RETURN(const std::optional<afd::ExpertLoad> load, expert_load_from(o));
    if (load) {
      afd::AfdConfig shape = a;
      shape.link_latency_us = 0;
      shape.link_bandwidth_mbps = 0;
      GB_RETURN_IF_ERROR(afd::fill_model_shape(cfg, 1, shape, &*load).status());
    }
  }
  return ok_status();
}

Result<runtime::DeviceOperator> make_device(const RunOptions& o) {
  runtime::DeviceConfig config = runtime::DeviceConfig::from_flags(o.soc, o.kv_cache_dtype);
  config.weight_quant = o.weight_quant;
  config.moe_dispatch = o.moe_dispatch;
  return runtime::DeviceOperator::create(config);
}

Result<std::unique_ptr<model::QuantizedWeights>> quantize_weights(const model::Checkpoint& ckpt,
                                                                  const runtime::DeviceOperator& dev, bool show) {
  const runtime::WeightQuantRepresentation* r = dev.weight_quant();
  if (!r) return std::unique_ptr<model::QuantizedWeights>();
  const bool tty = show && ::isatty(2);
  int last_pct = -1;
  const model::QuantizeProgressFn progress = [&](int64_t done, int64_t total) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (!tty || pct == last_pct) return;
    last_pct = pct;
    fmt::print(stderr, "\rquantizing weights to {}: {}/{} matrices ({}%)", ops::weight_quant_scheme_name(r->scheme),
               done, total, pct);
  };
  model::QuantizeOptions qo;
  qo.mxfp4_repr = dev.mxfp4_weight_quant();
  qo.progress = &progress;
  auto q = model::QuantizedWeights::quantize(ckpt, *r, dev.contract().weight_quant.layers, qo);
  if (tty) fmt::print(stderr, "\r\033[K");
  return q;
}

std::string describe_weights(const model::Checkpoint& ckpt, const model::QuantizedWeights* q) {
  const uint64_t all = ckpt.mapped_weight_bytes() + ckpt.converted_weight_bytes();
  const model::Checkpoint::QuantizedForm form = ckpt.quantized_form();
  const auto mib = [](uint64_t b) { return static_cast<double>(b) / (1 << 20); };
  if (!q) {
    std::string line = fmt::format("weights: bf16 (weight_quant=none), {:.1f} MiB", mib(all));
    if (form.fp8 + form.mxfp4 > 0) {  // what runs in place of the checkpoint's quantized weights, said once
      line += fmt::format(
          "; the checkpoint's {} FP8 and {} MXFP4 weights ({:.1f} MiB in the file) run as their bf16 dequantization "
          "({:.1f} MiB), {}",
          form.fp8, form.mxfp4, mib(form.file_bytes), mib(form.bf16_bytes),
          form.exact ? "exact" : "each value rounded once to bf16 (at most 2^-9 relative)");
    }
    return line;
  }
  const model::ModelConfig& c = ckpt.config();
  std::string bf16_roles = "router, LM head, embeddings and norms";
  if (c.has_indexer()) bf16_roles = "router, LM head, DSA indexer, embeddings and norms";
  if (c.is_deepseek_v4()) {
    bf16_roles = fmt::format("router, LM head, compressors, indexer{}, hyper-connections, embeddings and norms",
                             form.fp8 > 0 ? " (its wq_b the exact bf16 dequantization of its FP8 blocks)" : "");
  }
  const uint64_t kept = all - q->replaced_bf16_bytes();
  return fmt::format("weights: {}; {} bf16 ({:.1f} MiB); {:.1f} MiB in all", q->describe(), bf16_roles, mib(kept),
                     mib(kept + q->quantized_bytes()));
}

std::filesystem::path synthetic_model_dir(const RunOptions& o) {
  return cache_root() / "models" / fmt::format("{}-seed{}", o.preset, o.model_seed);
}

Result<std::filesystem::path> resolve_model_dir(const RunOptions& o, bool build) {
  if (!o.model_dir.empty()) return std::filesystem::path(o.model_dir);
  const std::filesystem::path dir = synthetic_model_dir(o);
  if (std::filesystem::exists(dir / "config.json")) {  // config.json is written last: complete
    // A model cached before make-model wrote tokenizers gets its tokenizer now (deterministic, renamed into place).
    if (build && !std::filesystem::exists(dir / "tokenizer.json")) {
      GB_RETURN_IF_ERROR(write_preset_tokenizer(o.preset, dir));
    }
    return dir;
  }
  if (!build) {
    // Every process of an mpirun job would race to build it.
    return invalid_argument(fmt::format(
        "no --model and the synthetic '{}' model (seed {}) is not built yet at {}; build it once before the mpirun "
        "job, e.g. `genbridge make-model --preset {} --seed {} DIR` and pass --model DIR",
        o.preset, o.model_seed, dir.string(), o.preset, o.model_seed));
  }
  if (!o.quiet) {
    fmt::print(stderr, "building synthetic model '{}' (seed {}) once, cached in {} ...\n", o.preset, o.model_seed,
               dir.string());
  }
  const auto t0 = std::chrono::steady_clock::now();
  GB_RETURN_IF_ERROR(write_preset_tokenizer(o.preset, dir));  // before config.json, which marks the cache complete
  GB_RETURN_IF_ERROR(model::write_synthetic_checkpoint(o.preset, o.model_seed, dir));
  if (!o.quiet) {
    fmt::print(stderr, "  built in {:.1f} s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return dir;
}

Status write_preset_tokenizer(std::string_view preset, const std::filesystem::path& dir) {
  GB_ASSIGN_OR_RETURN(const model::ModelConfig c, model::synthetic_preset_config(preset));
  return text::write_synthetic_tokenizer(dir, c.vocab_size);
}

const std::vector<std::vector<int32_t>>& explicit_prompt_tokens(const RunOptions& o) {
  return o.prompts.empty() ? o.prompt_text_tokens : o.prompt_tokens;
}

bool has_explicit_prompts(const RunOptions& o) { return !o.prompts.empty() || !o.prompt_texts.empty(); }

std::string json_quoted(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status check_model_has_tokenizer(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "tokenizer.json";
  if (!std::filesystem::exists(file)) {
    return invalid_argument(fmt::format(
        "--prompt-text needs the model's tokenizer, but {} does not exist (make-model writes one; for a Hugging "
        "Face checkpoint, put its tokenizer.json next to the weights)",
        file.string()));
  }
  return ok_status();
}

Status encode_prompt_texts(const text::Tokenizer& tok, RunOptions* o) {
  o->prompt_text_tokens.clear();
  for (const std::string& t : o->prompt_texts) {
    auto ids = tok.encode(t);
    if (!ids.ok()) return invalid_argument(fmt::format("--prompt-text {}: {}", json_quoted(t), ids.status().message()));
    if (ids->empty()) {
      return invalid_argument(fmt::format("--prompt-text {}: the text encodes to no token", json_quoted(t)));
    }
    o->prompt_text_tokens.push_back(std::move(ids).value());
  }
  return ok_status();
}

std::vector<engine::Request> make_requests(const RunOptions& o, int64_t vocab) {
  std::vector<engine::Request> reqs;
  if (has_explicit_prompts(o)) {
    for (const auto& p : explicit_prompt_tokens(o)) reqs.push_back({.prompt = p});
  } else {
    // Deterministic prompts: a counter-based hash of (request, position), uniform over the vocabulary.
    for (int r = 0; r < o.num_prompts; ++r) {
      engine::Request q;
      for (int i = 0; i < o.prompt_len; ++i) {
        q.prompt.push_back(static_cast<int32_t>(engine::uniform_from(0x5eedull + static_cast<uint64_t>(r), i) *
                                                static_cast<double>(vocab)));
      }
      reqs.push_back(std::move(q));
    }
  }
  const engine::SamplingParams sp{.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p, .seed = o.seed};
  for (size_t r = 0; r < reqs.size(); ++r) {
    reqs[r].id = static_cast<int64_t>(r);
    reqs[r].max_new_tokens = o.max_new_tokens;
    reqs[r].stop_tokens = o.stop_tokens;
    reqs[r].sampling = sp;
    reqs[r].sampling.seed = o.seed + r;  // wraps modulo 2^64
  }
  return reqs;
}

Result<model::Checkpoint> open_checkpoint(const std::filesystem::path& dir, const RunOptions& o, bool populate) {
  GB_ASSIGN_OR_RETURN(model::Checkpoint ckpt,
                      model::Checkpoint::open(dir, {.populate = populate, .use_mmap = !o.no_mmap}));
  if (o.check_weights) {
    // The cost line is printed even with --quiet: it is what --check-weights was asked for.
    model::WeightScan scan;
    const Status finite = ckpt.check_finite(&scan);
    fmt::print(stderr, "check-weights: {} tensors, {:.1f} MiB scanned in {:.3g} s ({:.1f} GB/s): {}\n", scan.tensors,
               static_cast<double>(scan.bytes) / (1 << 20), scan.seconds,
               scan.seconds > 0 ? static_cast<double>(scan.bytes) / scan.seconds / 1e9 : 0.0,
               finite.ok() ? "all finite" : "a weight is not finite");
    GB_RETURN_IF_ERROR(finite);
  }
  return ckpt;
}

std::string describe_model(const model::Checkpoint& ckpt) {
  std::string line =
      fmt::format("model {}: {}, {:.1f} MiB of weights", ckpt.dir().string(), model::describe(ckpt.config()),
                  static_cast<double>(ckpt.mapped_weight_bytes() + ckpt.converted_weight_bytes()) / (1 << 20));
  if (const int64_t n = ckpt.ignored_tensors(); n > 0) {
    const std::string_view what =
        ckpt.config().is_deepseek_v4()
            ? "of the multi-token prediction layers (mtp.*) ignored: genbridge does not run them"
            : "of the vision tower (model.visual.*) and the multi-token prediction head (mtp.*) ignored: text-only "
              "serving";
    line += fmt::format("\nmodel {}: {} tensor{} {}", ckpt.dir().string(), n, n == 1 ? "" : "s", what);
  }
  return line;
}

engine::KvPoolOptions kv_pool_options(const RunOptions& o, int num_pools, int pools_in_process,
                                      int64_t whole_context_seqs) {
  return {.memory_mb = o.kv_memory_mb,
          .num_pools = num_pools,
          .pools_in_process = pools_in_process,
          .whole_context_seqs = whole_context_seqs,
          .state_slots = o.max_batch};
}

engine::AssemblyOptions assembly_options(const RunOptions& o, const engine::KvPoolOptions& kv_pool,
                                         const model::QuantizedWeights* quantized) {
  return {.engine = {.max_batch = o.max_batch,
                     .max_num_batched_tokens = o.max_num_batched_tokens,
                     .record_logits = !o.dump_logits.empty(),
                     .record_choices = !o.dump_choices.empty(),
                     .policy = o.scheduling_policy == "priority" ? engine::SchedulingPolicy::kPriority
                                                                 : engine::SchedulingPolicy::kFcfs,
                     .preemption = o.preemption == "recompute" ? engine::Preemption::kRecompute
                                                               : engine::Preemption::kOff,
                     .prefix_caching = o.enable_prefix_caching},
          .kv_pool = kv_pool,
          .quantized = quantized};
}

int Reporter::usage(const Status& s) const {
  fmt::print(stderr, "genbridge {}: {}\n", command, s.message());
  return kExitUsage;
}

int Reporter::fail(const Status& s) const {
  fmt::print(stderr, "genbridge {}: {}\n", command, s.to_string());
  return kExitFailed;
}

std::unique_ptr<StartedModel> start_model(const RunOptions& o, const StartOptions& options, const Reporter& report,
                                          int* exit_code) {
  auto failed = [exit_code](int code) {
    *exit_code = code;
    return std::unique_ptr<StartedModel>();
  };
  if (o.threads > 0) set_num_threads(o.threads);
  auto dev = make_device(o);
  if (!dev.ok()) return failed(report.fail(dev.status()));
  if (options.log) fmt::print(stderr, "{}\n{}\n", dev->log_line(), cpu_target_line());
  auto dir = resolve_model_dir(o, options.build_model);
  if (!dir.ok()) return failed(report.fail(dir.status()));
  std::string more_lines;  // after the model's line
  if (options.at_model_dir) {
    if (const int code = options.at_model_dir(*dir, &more_lines); code != kExitOk) return failed(code);
  }
  auto ckpt = open_checkpoint(*dir, o, options.populate);
  if (!ckpt.ok()) return failed(report.fail(ckpt.status()));
  auto started = std::make_unique<StartedModel>(
      StartedModel{.dev = std::move(dev).value(), .dir = std::move(dir).value(), .ckpt = std::move(ckpt).value()});
  if (options.log) fmt::print(stderr, "{}\n{}", describe_model(started->ckpt), more_lines);
  // --weight-quant: quantized once here, before any request runs (progress on a terminal, cost printed); under
  // mpirun each rank quantizes only its share once it knows its role (afd), and the lines come from there.
  const engine::WeightQuantTiming timing = engine::weight_quant_timing(started->dev, options.mode == RunMode::kAfdMpi);
  if (timing == engine::WeightQuantTiming::kAtLoad) {
    auto q = quantize_weights(started->ckpt, started->dev, options.log);
    if (!q.ok()) return failed(report.fail(q.status()));
    started->quantized = std::move(q).value();
  }
  if (options.log && timing != engine::WeightQuantTiming::kRankShare) {
    fmt::print(stderr, "{}\n", describe_weights(started->ckpt, started->quantized.get()));
  }
  return started;
}

void print_results(const std::vector<engine::RequestResult>& results, const text::Tokenizer* tokenizer) {
  for (const auto& r : results) {
    if (!engine::completed(r)) {  // refused, or ended by an error: the message says why
      fmt::print("request {}: {}: {}\n", r.id, engine::finish_reason_name(r.reason), r.message);
      continue;
    }
    fmt::print("request {} ({}, {} tokens): {}\n", r.id, engine::finish_reason_name(r.reason), r.tokens.size(),
               fmt::join(r.tokens, " "));
    if (tokenizer) fmt::print("request {} text: {}\n", r.id, json_quoted(tokenizer->decode(r.tokens)));
  }
}

void print_metrics(const engine::EngineMetrics& m, const runtime::DeviceOperator& dev, const model::ModelConfig& cfg,
                   int64_t num_requests, int num_ranks) {
  auto rate = [](double n, double s) { return s > 0 ? n / s : 0.0; };
  fmt::print("\n{:<34} {}\n", "metric", "value");
  fmt::print("{:<34} {:.1f}\n", "prefill tokens/s", rate(m.prefill_tokens, m.prefill_seconds));
  fmt::print("{:<34} {:.1f}\n", "decode tokens/s", rate(m.decode_tokens, m.decode_seconds));
  if (num_ranks > 1) {
    fmt::print("{:<34} {:.1f}\n", fmt::format("decode tokens/s per rank ({} ranks)", num_ranks),
               rate(m.decode_tokens, m.decode_seconds) / num_ranks);
  }
  fmt::print("{:<34} {:.2f} / {:.2f}\n", "TTFT p50 / p99 (ms)", 1e3 * engine::percentile(m.ttft_seconds, 50),
             1e3 * engine::percentile(m.ttft_seconds, 99));
  fmt::print("{:<34} {:.2f} / {:.2f}\n", "TPOT p50 / p99 (ms)", 1e3 * engine::percentile(m.tpot_seconds, 50),
             1e3 * engine::percentile(m.tpot_seconds, 99));
  fmt::print("{:<34} {}\n", "KV representation", engine::describe_kv_representation(dev, cfg, m.kv_bytes_per_token));
  fmt::print("{:<34} {} prefill + {} decode\n", "tokens", m.prefill_tokens, m.decode_tokens);
  fmt::print("{:<34} {} finished, {} refused, {} failed\n", "requests",
             num_requests - m.requests_refused - m.requests_failed, m.requests_refused, m.requests_failed);
  fmt::print("{:<34} {} ({} tokens fed again)\n", "preemptions", m.preemptions, m.recomputed_tokens);
  if (m.prefix_cache_queries > 0) {
    fmt::print("{:<34} {} of {} tokens ({:.1f}%), {} pages evicted, {} cached at the end\n", "prefix cache hits",
               m.prefix_cache_hits, m.prefix_cache_queries,
               100.0 * static_cast<double>(m.prefix_cache_hits) / static_cast<double>(m.prefix_cache_queries),
               m.prefix_cache_evictions, m.prefix_cache_pages);
  }
}

Status dump_choices(const std::string& path, const std::vector<engine::RequestResult>& results) {
  std::string out;
  int64_t lines = 0;
  auto list = [&out](const char* key, auto values) {
    out += fmt::format(R"(,"{}":[)", key);
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) out += ',';
      if constexpr (std::is_floating_point_v<typename decltype(values)::value_type>) {
        out += std::isfinite(values[i]) ? fmt::format("{}", values[i]) : std::string("null");  // JSON has no inf
      } else {
        out += fmt::format("{}", values[i]);
      }
    }
    out += ']';
  };
  for (const engine::RequestResult& r : results) {
    const engine::RequestChoices& c = r.choices;
    size_t e = 0, x = 0;
    for (const engine::ChoiceRecord& rec : c.records) {
      out +=
          fmt::format(R"({{"request":{},"step":{},"position":{},"layer":{})", r.id, rec.step, rec.position, rec.layer);
      if (rec.num_experts > 0) {
        list("experts", std::span(c.expert_ids).subspan(e, rec.num_experts));
        list("weights", std::span(c.expert_weights).subspan(e, rec.num_experts));
      }
      if (rec.num_index > 0) list("index_topk", std::span(c.index_positions).subspan(x, rec.num_index));
      out += "}\n";
      e += rec.num_experts;
      x += rec.num_index;
      ++lines;
    }
  }
  const std::span<const std::byte> part(reinterpret_cast<const std::byte*>(out.data()), out.size());
  GB_RETURN_IF_ERROR(engine::write_output_file("--dump-choices", path, {&part, 1}));
  fmt::print(stderr, "wrote {} choice lines to {}\n", lines, path);
  return ok_status();
}

Status dump_logits(const std::string& path, const std::vector<engine::RequestResult>& results, int64_t vocab) {
  std::vector<float> all;
  int64_t rows = 0;
  for (const auto& r : results) {
    all.insert(all.end(), r.logits.begin(), r.logits.end());
    rows += static_cast<int64_t>(r.logits.size()) / vocab;
  }
  GB_RETURN_IF_ERROR(engine::write_npy_f32(path, all, rows, vocab, "--dump-logits"));
  fmt::print(stderr, "wrote {} logit rows x {} to {}\n", rows, vocab, path);
  return ok_status();
}

ProgressPrinter::ProgressPrinter(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO)), start_(now_s()) {}

void ProgressPrinter::update(const engine::Progress& p) {
  if (quiet_) return;
  const double t = now_s();
  const bool last = p.finished == p.total;
  if (!last && t - last_print_ < (tty_ ? 0.2 : 2.0)) return;
  last_print_ = t;
  const std::string line =
      fmt::format("[{:6.1f} s] requests {}/{} finished, {} running, {} waiting; {} tokens generated", t - start_,
                  p.finished, p.total, p.running, p.waiting, p.generated_tokens);
  if (tty_) {
    fmt::print(stderr, "\r{:<100}", line);
  } else {
    fmt::print(stderr, "{}\n", line);
  }
  printed_ = true;
}

void ProgressPrinter::clear() {
  if (printed_ && tty_) fmt::print(stderr, "\n");
  printed_ = false;
}

}  // namespace genbridge::tools
