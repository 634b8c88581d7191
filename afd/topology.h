#pragma once
// Who is who in an AFD job: A attention ranks and F FFN ranks over world ranks 0..A+F-1, and which FFN
// rank owns which experts (FFN rank f owns [f*E/F, (f+1)*E/F)). Plus the dispatch layout of one
// transfer: which tokens go to which FFN rank and which (token, slot) outputs each returns.

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "afd/config.h"
#include "afd/transport.h"
#include "genbridge/core/status.h"
#include "genbridge/core/tensor.h"

namespace genbridge::afd {

struct Topology {
  int num_attention = 0;
  int num_ffn = 0;
  int num_experts = 0;
  int experts_per_ffn = 0;
  std::vector<Role> roles;           // by world rank
  std::vector<int> role_rank;        // by world rank: index within its role
  std::vector<int> attention_world;  // world rank of attention rank a
  std::vector<int> ffn_world;        // world rank of FFN rank f

  // Redundant experts (afd/placement.h), per MoE layer: moe_index[layer] (-1: dense) selects the layer's
  // holder lists, holders[i][holder_offsets[i][e] .. holder_offsets[i][e + 1]) with the home rank first and
  // the copies in AfdConfig::replicas order. Empty without copies.
  std::vector<int> moe_index;
  std::vector<std::vector<int32_t>> holder_offsets;
  std::vector<std::vector<int32_t>> holders;
  // held_range's answers, from the lists: [MoE layer index][ffn], and over every layer [ffn].
  std::vector<std::vector<std::pair<int, int>>> layer_held;
  std::vector<std::pair<int, int>> all_held;

  int world_size() const { return num_attention + num_ffn; }
  int ffn_of_expert(int expert) const { return expert / experts_per_ffn; }  // the home rank
  int expert_begin(int ffn) const { return ffn * experts_per_ffn; }          // home experts [begin, end)
  int expert_end(int ffn) const { return (ffn + 1) * experts_per_ffn; }
  bool has_replicas() const { return !holders.empty(); }
  // Whether FFN rank `ffn` holds `expert` of `layer` (its own or a copy).
  bool holds(int layer, int expert, int ffn) const;
  // The smallest expert range holding every expert FFN rank `ffn` holds in `layer` (layer < 0: in any layer).
  std::pair<int, int> held_range(int layer, int ffn) const;
  // "ffn rank 1 (world rank 3)".
  std::string rank_name(int world_rank) const;
  std::vector<std::string> rank_names() const;
};

// Builds the topology from the roles ranks were started with (indexed by world rank). All undeclared:
// rank order (world ranks 0..A-1 attention, the rest FFN). All declared: attention ranks in world-rank
// order, then FFN ranks likewise; the counts must match the config. A mix is an error.
Result<Topology> make_topology(const AfdConfig& cfg, std::span<const int> declared_roles);

// Tokens [begin, end) of `stage` when a batch of `num_tokens` is split into `num_stages` micro-batches
// (the first num_tokens % num_stages stages get one extra token; a stage may be empty).
std::pair<int, int> stage_bounds(int num_tokens, int num_stages, int stage);

// Dispatch layout of one transfer of n tokens (DeepEP's get_dispatch_layout): FFN rank f receives the
// tokens in tokens[token_offsets[f] .. token_offsets[f+1]) (ascending token order: every token that has
// at least one of its top-k experts on f) and returns one output row per (token, slot) it owns, in token
// order then ascending slot: rows_token/rows_slot[row_offsets[f] .. row_offsets[f+1]).
struct DispatchLayout {
  std::vector<int8_t> slot_ffn;        // [n * k]: the FFN rank computing each (token, slot)
  std::vector<int32_t> seen;           // scratch: rows of each expert met so far (the holder split)
  std::vector<int32_t> token_offsets;  // [F + 1]
  std::vector<int32_t> tokens;         // token indices
  std::vector<int32_t> row_offsets;    // [F + 1]
  std::vector<int32_t> rows_token;     // token index of each output row
  std::vector<int32_t> rows_slot;      // top-k slot of each output row
  int num_tokens_to(int f) const { return token_offsets[f + 1] - token_offsets[f]; }
  int num_rows_from(int f) const { return row_offsets[f + 1] - row_offsets[f]; }
};

// Fills `layout` for topk_ids (i32 [n, k], any strides) of MoE layer `layer`; reuses its capacity. A
// (token, slot) goes to its expert's home rank, or with copies to the holder the split picks (afd/placement.h)
// for transfer number `transfer`. InvalidArgument names the first expert id outside [0, E).
Status compute_dispatch_layout(const TensorView& topk_ids, const Topology& topo, int layer, DispatchLayout* layout,
                               int64_t transfer = 0);

// The ids FFN rank `ffn` receives for token `t` of a dispatch: topk_ids[t, j] where the layout sends that slot
// to `ffn`, -1 elsewhere (the slots another rank computes).
void write_sent_ids(const TensorView& topk_ids, const DispatchLayout& layout, int t, int ffn, int32_t* out);

// The output rows FFN rank `ffn` computes for received tokens with topk_ids (i32 [m, k], contiguous, -1 for
// the slots other ranks compute) of `layer`, appended to rows_token/rows_slot with token indices offset by
// `token_base`. Same order as above. InvalidArgument when an id names an expert the rank does not hold.
Status append_owned_rows(const int32_t* topk_ids, int m, int k, const Topology& topo, int ffn, int layer,
                         int token_base, std::vector<int32_t>* rows_token, std::vector<int32_t>* rows_slot);

}  // namespace genbridge::afd
