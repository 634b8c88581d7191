// genbridge: the command-line tool. `genbridge run` is the main job; see --help of each subcommand.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <exception>

#include "runtime/device/soc.h"
#include "tools/commands.h"

namespace {

// The flags `run` and `afd-worker` share: model, prompts, sampling, batching, AFD settings.
void add_run_options(CLI::App* run, genbridge::tools::RunOptions& ro) {
  run->add_option("--model", ro.model_dir,
                  "Model directory: config.json + model.safetensors or sharded model-*-of-*.safetensors with\n"
                  "model.safetensors.index.json (Hugging Face layout, Qwen3-MoE family). Default: a synthetic model");
  run->add_option("--preset", ro.preset, "Synthetic model preset when --model is not given (tiny, tiny-gemma, small)")
      ->capture_default_str();
  run->add_option("--model-seed", ro.model_seed, "Seed of the synthetic model's weights")->capture_default_str();
  run->add_option("--num-prompts", ro.num_prompts, "Number of generated prompts (ignored with --prompt)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  run->add_option("--prompt-len", ro.prompt_len, "Tokens per generated prompt")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  run->add_option("--prompt", ro.prompts, "An explicit prompt as comma-separated token ids (repeatable)");
  run->add_option("--max-new-tokens", ro.max_new_tokens, "Tokens to generate per request (>= 1)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  run->add_option("--stop-token", ro.stop_tokens, "Token id that ends a request when generated (repeatable)");
  run->add_option("--temperature", ro.temperature, "Sampling temperature; 0 = greedy")->capture_default_str();
  run->add_option("--top-k", ro.top_k, "Keep the k most likely tokens; 0 = all")->capture_default_str();
  run->add_option("--top-p", ro.top_p, "Nucleus sampling mass in (0, 1]")->capture_default_str();
  run->add_option("--seed", ro.seed, "Sampling seed (request r uses seed + r)")->capture_default_str();
  run->add_option("--max-batch", ro.max_batch, "Most sequences decoded together (continuous batching)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  run->add_option("--kv-memory-mb", ro.kv_memory_mb,
                  "KV cache pool size in MiB; 0 = enough for every request at once. Requests that do not fit wait;\n"
                  "a request that can never fit is refused with a message")
      ->capture_default_str();
  run->add_option("--kv-cache-dtype", ro.kv_cache_dtype,
                  "auto | bf16 | quantized. Whether KV is quantized; the generation decides how (int8 or fp8)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "bf16", "quantized"}));
  run->add_option("--soc", ro.soc,
                  "SoC the run is meant for; must match this build's generation. Default: GENBRIDGE_SOC, else the\n"
                  "build's SoC. Accepted: " + std::string(genbridge::runtime::accepted_soc_selectors()));
  run->add_option("--threads", ro.threads, "Kernel threads; 0 = GENBRIDGE_NUM_THREADS or all cores")->capture_default_str();
  run->add_option("--dump-logits", ro.dump_logits,
                  "Write the last-position fp32 logits of every step to FILE.npy, shape (rows, vocab): rows grouped\n"
                  "by request in request order, one row per generated token");
  run->add_flag("--quiet", ro.quiet, "No progress output");
  run->add_option("--afd", ro.afd,
                  "Attention-FFN disaggregation topology, e.g. 2A1F (2 attention ranks, 1 FFN rank). Empty: monolithic");
  run->add_option("--afd-connector", ro.afd_connector, "sync (control plane) | async (self-describing messages)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sync", "async"}));
  run->add_option("--afd-stages", ro.afd_stages, "Micro-batch stages per step (1-3)")->capture_default_str();
  run->add_option("--afd-transport", ro.afd_transport, "inproc (threads) | mpi (use `genbridge afd-worker` under mpirun)")
      ->capture_default_str();
  run->add_option("--afd-timeout", ro.afd_timeout_s, "Deadline in seconds for every AFD wait")->capture_default_str();
  run->add_option("--afd-warmup-steps", ro.afd_warmup_steps,
                  "First steps of each attention rank that run as usual but are left out of the AFD metrics")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  run->add_option("--trace", ro.trace, "Write a Chrome/Perfetto trace (JSON) of the run to FILE.json");
}

}  // namespace

int main(int argc, char** argv) {
  using genbridge::tools::MakeModelOptions;
  using genbridge::tools::RunOptions;
  CLI::App app{
      "genbridge: Mixture-of-Experts decoding with stable operator contracts per accelerator generation.\n"
      "Subcommands: run (decode a batch; the main job), afd-worker (one process of an mpirun AFD job),\n"
      "make-model (write a synthetic checkpoint), info (what this build was made for).\n"
      "`genbridge <subcommand> --help` explains each flag."};
  app.require_subcommand(1);

  RunOptions ro;
  CLI::App* run = app.add_subcommand(
      "run",
      "Decode a batch of prompts and print the generated token ids and a metrics table. With no arguments it\n"
      "builds (once, cached) the synthetic 'small' model and decodes 8 prompts of 32 tokens, 32 new tokens each.");
  add_run_options(run, ro);

  RunOptions wo;
  wo.afd_transport = "mpi";
  std::string worker_role;
  CLI::App* worker = app.add_subcommand(
      "afd-worker",
      "One process of an attention-FFN disaggregated job under mpirun (Open MPI transport). Every process of\n"
      "the job runs it with the same flags as `run --afd`, e.g.\n"
      "  mpirun -np 2 genbridge afd-worker --role attention --afd 2A1F : -np 1 genbridge afd-worker --role ffn --afd 2A1F\n"
      "or without --role (world ranks 0..A-1 attention, the rest FFN). Request r goes to attention rank r % A;\n"
      "world rank 0 prints every result in request order, the metrics and the AFD report.");
  add_run_options(worker, wo);
  worker->add_option("--role", worker_role, "attention | ffn (MPMD launch); empty: roles from rank order")
      ->check(CLI::IsMember({"attention", "ffn"}));

  MakeModelOptions mo;
  CLI::App* make = app.add_subcommand(
      "make-model", "Write a synthetic Qwen3-MoE checkpoint (config.json + safetensors) with fixed-seed weights.");
  make->add_option("--preset", mo.preset, "tiny | tiny-gemma | small")->capture_default_str();
  make->add_option("--seed", mo.seed, "Weight seed")->capture_default_str();
  make->add_option("--shards", mo.shards, "Number of safetensors shards (> 1 writes an index)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  make->add_option("OUT_DIR", mo.out_dir, "Directory to write (created if needed)")->required();

  std::string info_soc;
  CLI::App* info = app.add_subcommand("info", "Print the build's provider target, SoC, module manifest and device contract.");
  info->add_option("--soc", info_soc, "Validate this SoC selector against the build");

  CLI11_PARSE(app, argc, argv);
  try {
    if (*run) return genbridge::tools::run(ro);
    if (*worker) return genbridge::tools::afd_worker(wo, worker_role);
    if (*make) return genbridge::tools::make_model(mo);
    if (*info) return genbridge::tools::info(info_soc);
  } catch (const std::exception& e) {
    fmt::print(stderr, "genbridge: error: {}\n", e.what());
    return 1;
  }
  return 2;
}
