#include "runtime/engine/assembly.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "runtime/forward/deepseek_attention.h"

namespace genbridge::engine {
namespace {

int64_t mib_ceil(int64_t bytes) { return (bytes + (int64_t{1} << 20) - 1) >> 20; }

// A server's budget: room for `seqs` sequences of the whole context in each pool, unless that would take
// more than half of this machine's memory over the pools in process; then half the memory split over them.
void cap_to_half_memory(const KvPoolOptions& o, const runtime::KvPageGeometry& g, int64_t max_position,
                        KvPoolPlan* plan) {
  const int64_t phys = physical_memory_bytes();
  if (o.memory_mb != 0 || phys <= 0) return;
  const int pools = std::max(o.pools_in_process, 1);
  const int64_t per_seq = g.pages_for(max_position) * g.bytes_per_page() + g.state.bytes_per_slot();
  const __int128 whole = static_cast<__int128>(per_seq) * o.whole_context_seqs * pools;
  if (whole <= phys / 2) return;
  plan->memory_mb = std::max<int64_t>(1, (phys / 2 / pools) >> 20);
  plan->note = fmt::format(
      "KV pool: room for --max-batch {} sequences of the whole context ({} tokens) would take {} MiB{}, more than "
      "half of this machine's memory; using {} MiB{} (requests wait for pages; set --kv-memory-mb to choose)",
      o.whole_context_seqs, max_position, static_cast<int64_t>(whole >> 20), pools > 1 ? " in all" : "",
      plan->memory_mb, pools > 1 ? fmt::format(" per attention rank ({})", pools) : "");
}

// Pages for every request at once in the busiest pool (request r in pool r % num_pools), or for a server's
// whole-context sequences.
int64_t demand_pages(const KvPoolOptions& o, const runtime::KvPageGeometry& g, std::span<const Request> requests,
                     int64_t max_position) {
  if (o.whole_context_seqs > 0) return std::max<int64_t>(o.whole_context_seqs * g.pages_for(max_position), 1);
  std::vector<int64_t> per_pool(static_cast<size_t>(std::max(o.num_pools, 1)), 0);
  for (size_t r = 0; r < requests.size(); ++r) {
    const int64_t tokens = static_cast<int64_t>(requests[r].prompt.size()) + requests[r].max_new_tokens - 1;
    per_pool[r % per_pool.size()] += g.pages_for(tokens);
  }
  return std::max<int64_t>(*std::max_element(per_pool.begin(), per_pool.end()), 1);
}

}  // namespace

int64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  if (pages > std::numeric_limits<int64_t>::max() / page) return std::numeric_limits<int64_t>::max();
  return static_cast<int64_t>(pages) * page;
}

Result<KvPoolPlan> plan_kv_pool(const KvPoolOptions& o, const runtime::KvPageGeometry& g,
                                std::span<const Request> requests, int64_t max_position) {
  KvPoolPlan plan{.geometry = g, .memory_mb = o.memory_mb};
  const int64_t page_bytes = g.bytes_per_page();
  if (page_bytes <= 0) return internal_error("kv pool sizing: a KV page of this model has no bytes");
  if (!g.state.empty()) {
    if (o.state_slots < 1 || o.state_slots > (int64_t{1} << 20)) {
      return invalid_argument(fmt::format(
          "kv pool sizing: the model keeps {} per sequence, so the pool needs between 1 and 1048576 state slots "
          "(--max-batch), not {}",
          g.state.contents, o.state_slots));
    }
    plan.state_slots = o.state_slots;
    plan.state_bytes = o.state_slots * g.state.bytes_per_slot();
  }
  if (o.whole_context_seqs > 0) cap_to_half_memory(o, g, max_position, &plan);
  // KvPagePool holds fewer than 2^31 pages.
  constexpr int64_t kMaxPages = std::numeric_limits<int32_t>::max() - 1;
  const int64_t mb = plan.memory_mb;
  if (mb > 0) {
    if (plan.state_bytes >= (mb << 20)) {
      return invalid_argument(fmt::format(
          "--kv-memory-mb {}: the state pool alone takes {} MiB (--max-batch {} sequences x {:.2f} MiB of {} "
          "each), leaving no room for KV pages; give at least {} or lower --max-batch",
          mb, mib_ceil(plan.state_bytes), plan.state_slots, static_cast<double>(g.state.bytes_per_slot()) / (1 << 20),
          g.state.contents, mib_ceil(plan.state_bytes + page_bytes)));
    }
    plan.pages =
        std::min(((mb << 20) - plan.state_bytes) / page_bytes, kMaxPages);  // the parse range keeps << 20 in int64
    if (plan.pages < 1) {
      return invalid_argument(fmt::format(
          "--kv-memory-mb {}: holds no KV page of this model ({} bytes: {} tokens x {} bytes per token); give at "
          "least {}",
          mb, page_bytes, g.page_size, g.bytes_per_token(), mib_ceil(page_bytes)));
    }
  } else {
    plan.pages = demand_pages(o, g, requests, max_position);
  }
  const int64_t phys = physical_memory_bytes();
  const __int128 total =
      (static_cast<__int128>(plan.pages) * page_bytes + plan.state_bytes) * std::max(o.pools_in_process, 1);
  if ((phys > 0 && total > phys) || plan.pages > kMaxPages) {
    const int64_t need_mib = total > std::numeric_limits<int64_t>::max() ? std::numeric_limits<int64_t>::max()
                                                                         : mib_ceil(static_cast<int64_t>(total));
    const std::string pools =
        o.pools_in_process > 1 ? fmt::format(" for each of the {} attention ranks in this process", o.pools_in_process)
                               : "";
    if (mb > 0) {
      return invalid_argument(
          fmt::format("--kv-memory-mb {}{}: {} MiB in all, more than this machine's physical memory ({} MiB)", mb,
                      pools, need_mib, phys >> 20));
    }
    return invalid_argument(fmt::format(
        "--kv-memory-mb 0 (room for every request at once{}): {} MiB of KV cache, more than this machine's physical "
        "memory ({} MiB); give a budget in MiB (requests then wait for pages)",
        pools, need_mib, phys >> 20));
  }
  return plan;
}

Result<KvPoolPlan> plan_kv_pool(const KvPoolOptions& options, const runtime::DeviceOperator& dev,
                                const model::ModelConfig& config, std::span<const Request> requests) {
  return plan_kv_pool(options, dev.kv_page_geometry(model::kv_model_shape(config)), requests,
                      config.max_position_embeddings);
}

WeightQuantTiming weight_quant_timing(const runtime::DeviceOperator& dev, bool multi_process) {
  if (!dev.weight_quant()) return WeightQuantTiming::kNone;
  return multi_process ? WeightQuantTiming::kRankShare : WeightQuantTiming::kAtLoad;
}

Result<std::unique_ptr<AssembledEngine>> assemble_engine(const model::Checkpoint& checkpoint,
                                                         const runtime::DeviceOperator& dev, int64_t pages,
                                                         const AssemblyOptions& options,
                                                         const ExecutorFactory& make_executor) {
  const runtime::KvPageGeometry geometry = dev.kv_page_geometry(model::kv_model_shape(checkpoint.config()));
  GB_ASSIGN_OR_RETURN(
      runtime::KvPagePool pool,
      runtime::KvPagePool::create(geometry, pages, geometry.state.empty() ? 0 : options.kv_pool.state_slots));
  auto out = std::make_unique<AssembledEngine>(std::move(pool));
  GB_ASSIGN_OR_RETURN(out->runner, model::ModelRunner::create(checkpoint, dev, out->pool, options.quantized));
  if (make_executor) {
    GB_ASSIGN_OR_RETURN(out->executor, make_executor(*out->runner));
  } else {
    out->executor = std::make_unique<LocalExecutor>(*out->runner);
    // This process computes every expert: pack them now rather than in the first request's forward.
    GB_RETURN_IF_ERROR(out->runner->experts().prepare(0, out->runner->experts().num_experts()));
  }
  out->engine = std::make_unique<Engine>(*out->executor, out->pool, options.engine);
  return out;
}

namespace {

// DeepSeek-V4: what the state slots hold (the rows' representation included), then what the pages hold: the
// compressed rows, one per `ratio` tokens in each compressed layer, and the indexer keys of the ratio-4 layers.
std::string describe_v4_kv(const runtime::DeviceOperator& dev, const model::ModelConfig& config,
                           int64_t kv_bytes_per_token) {
  const runtime::KvModelShape shape = model::kv_model_shape(config);
  std::map<int64_t, int64_t> layers_per_ratio;
  for (int64_t m : shape.compress_ratios) {
    if (m > 0) ++layers_per_ratio[m];
  }
  const std::string state = dev.state_contract_line(shape);
  if (layers_per_ratio.empty()) return state + "; KV pages: none (every layer attends to its sliding window only)";
  std::vector<std::string> per;
  int64_t compressed = 0;
  for (const auto& [m, n] : layers_per_ratio) {
    per.push_back(fmt::format("per {} tokens in {}", m, n));
    compressed += n;
  }
  std::string text = fmt::format("{}; KV pages: the compressed rows of {} layer{} in the same representation (one {})",
                                 state, compressed, compressed == 1 ? "" : "s", fmt::join(per, ", "));
  if (shape.index_head_dim > 0 && layers_per_ratio.contains(4)) {
    const ops::IndexerKeyFormat keys = dev.sharedkv_indexer_key_format();
    text += fmt::format(" + indexer keys {} ({} B per row) of {}", ops::indexer_key_format_name(keys),
                        ops::indexer_key_row_bytes(keys, shape.index_head_dim).total(), layers_per_ratio[4]);
  }
  return text + fmt::format(": {} bytes per token ({} layers)", kv_bytes_per_token, config.num_hidden_layers);
}

}  // namespace

std::string describe_kv_representation(const runtime::DeviceOperator& dev, const model::ModelConfig& config,
                                       int64_t kv_bytes_per_token) {
  if (config.is_deepseek_v4()) return describe_v4_kv(dev, config, kv_bytes_per_token);
  if (config.is_deepseek()) {  // MLA latent rows (+ indexer keys), per layer
    const std::string keys =
        config.has_indexer() ? fmt::format(" + indexer keys {}", ops::indexer_key_format_name(dev.indexer_key_format()))
                             : "";
    return fmt::format("MLA {}{} ({} bytes per token per layer, {} bytes per token, all {} layers)",
                       ops::mla_kv_format_name(dev.mla_kv_format()), keys,
                       kv_bytes_per_token / config.num_hidden_layers, kv_bytes_per_token, config.num_hidden_layers);
  }
  if (config.is_qwen35()) {
    return fmt::format("{} ({} bytes per token, the {} full-attention layers of {}); {}",
                       ops::kv_cache_format_name(dev.kv_format()), kv_bytes_per_token, config.num_kv_layers(),
                       config.num_hidden_layers, dev.state_contract_line(model::kv_model_shape(config)));
  }
  return fmt::format("{} ({} bytes per token, all {} layers)", ops::kv_cache_format_name(dev.kv_format()),
                     kv_bytes_per_token, config.num_hidden_layers);
}

std::string describe_kv_pool(const KvPoolPlan& plan, const runtime::DeviceOperator& dev,
                             const model::ModelConfig& config, bool per_attention_rank) {
  const runtime::KvPageGeometry& g = plan.geometry;
  std::string text =
      fmt::format("KV pool{}: {} pages of {} tokens ({:.1f} MiB)", per_attention_rank ? " per attention rank" : "",
                  plan.pages, g.page_size, static_cast<double>(plan.pages * g.bytes_per_page()) / (1 << 20));
  if (plan.state_slots > 0) {
    text += fmt::format(" + {} state slots, one per running sequence ({:.1f} MiB)", plan.state_slots,
                        static_cast<double>(plan.state_bytes) / (1 << 20));
  }
  return text + "; KV representation: " + describe_kv_representation(dev, config, g.bytes_per_token());
}

}  // namespace genbridge::engine
