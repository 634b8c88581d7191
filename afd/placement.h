#pragma once
// Redundant experts (EPLB): copies of the hottest experts on other FFN ranks, planned from a measured expert
// load, and the deterministic split of an expert's rows between its holders.
//
// The load is rows ((token, slot) pairs) per expert per MoE layer, as the AFD report counts them over the
// measured steps (`genbridge run --afd ... --afd-expert-load-out FILE` writes it). The plan, per MoE layer, N
// (redundant_experts) times: the expert with the most rows per copy (ties: the lower id) that can still get a
// copy -- some FFN rank with a free slot (N / F per rank) does not hold it -- gets one on the least-loaded such
// rank (ties: the lower rank), where a rank's load is the rows per copy summed over the experts it holds.
// The split (compute_dispatch_layout): in transfer number r, the i-th (token, slot) routed to expert e in token
// order goes to holder (r + i) mod c_e (holder 0 is the home rank, then the copies in plan order), where
// r = (step x stages + stage) x attention ranks + the sending attention rank, so that transfers of one row
// each still take turns between the holders. A copy computes exactly what the home rank would
// (moe/expert_ffn is batch-invariant), so the tokens are the same bits with or without copies.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "afd/config.h"
#include "afd/metrics.h"
#include "runtime/checkpoint/config.h"
#include "genbridge/core/status.h"

namespace genbridge::afd {

// A measured expert load: rows[i][e] for MoE layer layers[i] (ascending) and expert e.
struct ExpertLoad {
  std::string source;  // where it was read from (a path), for errors
  int num_experts = 0;
  std::vector<int> layers;
  std::vector<std::vector<int64_t>> rows;
};

// The file form: {"format": "genbridge-expert-load", "version": 1, "num_experts": E,
//                 "layers": [{"layer": l, "rows": [E counts]}, ...]}.
std::string expert_load_json(const ExpertLoad& load);
// Parses and checks the file form; errors name `source` (a path) and the rule.
Result<ExpertLoad> parse_expert_load(std::string_view text, std::string_view source);
Result<ExpertLoad> read_expert_load(const std::filesystem::path& path);
Status write_expert_load(const std::filesystem::path& path, const ExpertLoad& load);

// The copies of `cfg.redundant_experts` per MoE layer (cfg's model-shape keys filled) planned from `load`,
// which must cover exactly cfg's MoE layers and experts (InvalidArgument naming the difference and `source`).
Result<std::vector<ExpertReplica>> plan_replicas(const AfdConfig& cfg, const ExpertLoad& load);

// The load an AFD report measured in the MoE layers of model `model`.
ExpertLoad measured_expert_load(const AfdReport& report, const model::ModelConfig& model);

// Rows per FFN rank in MoE layer `layer_index` (into cfg.moe_layers()) when each expert's load is split evenly
// between its holders under `cfg.replicas` (the plan's objective; the real split differs by at most one row per
// expert and transfer).
std::vector<double> planned_rank_rows(const AfdConfig& cfg, const ExpertLoad& load, int layer_index);

}  // namespace genbridge::afd
