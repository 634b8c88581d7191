#include "afd/topology.h"

#include <fmt/format.h>

#include <algorithm>

namespace genbridge::afd {

std::string Topology::rank_name(int world_rank) const {
  if (world_rank < 0 || world_rank >= static_cast<int>(roles.size())) return fmt::format("world rank {}", world_rank);
  return fmt::format("{} rank {} (world rank {})", role_name(roles[world_rank]), role_rank[world_rank], world_rank);
}

std::vector<std::string> Topology::rank_names() const {
  std::vector<std::string> out;
  for (int r = 0; r < world_size(); ++r) out.push_back(rank_name(r));
  return out;
}

Result<Topology> make_topology(const AfdConfig& cfg, std::span<const int> declared_roles) {
  const int n = static_cast<int>(declared_roles.size());
  const int want = cfg.num_attention + cfg.num_ffn;
  if (n != want) {
    return invalid_argument(fmt::format(
        "afd: the job has {} ranks but the config asks for {} attention + {} FFN = {} ranks ('attention_ranks', "
        "'ffn_ranks'); start exactly {} ranks",
        n, cfg.num_attention, cfg.num_ffn, want, want));
  }
  int declared = 0, attention = 0;
  for (int r = 0; r < n; ++r) {
    if (declared_roles[r] != kRoleUndeclared) ++declared;
    if (declared_roles[r] == static_cast<int>(Role::kAttention)) ++attention;
  }
  if (declared != 0 && declared != n) {
    return invalid_argument(fmt::format(
        "afd: {} of {} ranks were started with --role and {} without; give every rank a role (MPMD launch) or none "
        "(roles from rank order)",
        declared, n, n - declared));
  }
  if (declared == n && attention != cfg.num_attention) {
    return invalid_argument(
        fmt::format("afd: {} ranks were started with --role attention and {} with --role ffn, but the config has "
                    "'attention_ranks' = {} and 'ffn_ranks' = {}",
                    attention, n - attention, cfg.num_attention, cfg.num_ffn));
  }
  Topology t;
  t.num_attention = cfg.num_attention;
  t.num_ffn = cfg.num_ffn;
  t.num_experts = cfg.num_experts;
  t.experts_per_ffn = cfg.experts_per_ffn();
  t.roles.resize(n);
  t.role_rank.resize(n);
  for (int r = 0; r < n; ++r) {
    const bool is_attention =
        declared == 0 ? r < cfg.num_attention : declared_roles[r] == static_cast<int>(Role::kAttention);
    t.roles[r] = is_attention ? Role::kAttention : Role::kFfn;
    if (is_attention) {
      t.role_rank[r] = static_cast<int>(t.attention_world.size());
      t.attention_world.push_back(r);
    } else {
      t.role_rank[r] = static_cast<int>(t.ffn_world.size());
      t.ffn_world.push_back(r);
    }
  }
  if (!cfg.replicas.empty()) {
    const std::vector<int> layers = cfg.moe_layers();
    const int E = cfg.num_experts;
    t.moe_index.assign(static_cast<size_t>(cfg.num_layers), -1);
    for (size_t i = 0; i < layers.size(); ++i) t.moe_index[static_cast<size_t>(layers[i])] = static_cast<int>(i);
    std::vector<std::vector<std::vector<int32_t>>> lists(layers.size(), std::vector<std::vector<int32_t>>(E));
    for (size_t i = 0; i < layers.size(); ++i) {
      for (int e = 0; e < E; ++e) lists[i][e].push_back(t.ffn_of_expert(e));
    }
    for (const ExpertReplica& r : cfg.replicas) lists[t.moe_index[static_cast<size_t>(r.layer)]][r.expert].push_back(r.ffn);
    t.holder_offsets.resize(layers.size());
    t.holders.resize(layers.size());
    for (int f = 0; f < t.num_ffn; ++f) t.all_held.emplace_back(t.expert_begin(f), t.expert_end(f));
    t.layer_held.assign(layers.size(), t.all_held);
    for (size_t i = 0; i < layers.size(); ++i) {
      t.holder_offsets[i].push_back(0);
      for (int e = 0; e < E; ++e) {
        t.holders[i].insert(t.holders[i].end(), lists[i][e].begin(), lists[i][e].end());
        t.holder_offsets[i].push_back(static_cast<int32_t>(t.holders[i].size()));
        for (size_t h = 1; h < lists[i][e].size(); ++h) {  // the copies
          for (std::pair<int, int>* r : {&t.layer_held[i][lists[i][e][h]], &t.all_held[lists[i][e][h]]}) {
            r->first = std::min(r->first, e);
            r->second = std::max(r->second, e + 1);
          }
        }
      }
    }
  }
  return t;
}

bool Topology::holds(int layer, int expert, int ffn) const {
  if (expert < 0 || expert >= num_experts) return false;
  if (ffn_of_expert(expert) == ffn) return true;
  if (!has_replicas() || layer < 0 || layer >= static_cast<int>(moe_index.size()) || moe_index[layer] < 0) return false;
  const size_t i = static_cast<size_t>(moe_index[layer]);
  for (int32_t h = holder_offsets[i][expert] + 1; h < holder_offsets[i][expert + 1]; ++h) {
    if (holders[i][h] == ffn) return true;
  }
  return false;
}

std::pair<int, int> Topology::held_range(int layer, int ffn) const {
  if (!has_replicas()) return {expert_begin(ffn), expert_end(ffn)};
  if (layer < 0) return all_held[ffn];
  if (layer >= static_cast<int>(moe_index.size()) || moe_index[layer] < 0) return {expert_begin(ffn), expert_end(ffn)};
  return layer_held[static_cast<size_t>(moe_index[layer])][ffn];
}

std::pair<int, int> stage_bounds(int num_tokens, int num_stages, int stage) {
  const int base = num_tokens / num_stages;
  const int extra = num_tokens % num_stages;
  const int begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

Status compute_dispatch_layout(const TensorView& ids, const Topology& topo, int layer, DispatchLayout* out,
                               int64_t transfer) {
  const int n = static_cast<int>(ids.dim(0));
  const int k = static_cast<int>(ids.dim(1));
  const int F = topo.num_ffn;
  const int32_t* base = ids.data_as<const int32_t>();
  const int64_t s0 = ids.stride(0), s1 = ids.stride(1);
  // The holder lists of this layer (none: every slot goes to its expert's home rank).
  const int mi = topo.has_replicas() && layer >= 0 && layer < static_cast<int>(topo.moe_index.size())
                     ? topo.moe_index[layer]
                     : -1;
  const int32_t* hoff = mi >= 0 ? topo.holder_offsets[mi].data() : nullptr;
  const int32_t* hold = mi >= 0 ? topo.holders[mi].data() : nullptr;
  if (hoff) out->seen.assign(static_cast<size_t>(topo.num_experts), 0);
  out->slot_ffn.resize(static_cast<size_t>(n) * k);
  // Per-token mask of destination ranks; ranks beyond 64 are impossible (kMaxFfnRanks).
  out->token_offsets.assign(F + 1, 0);
  out->row_offsets.assign(F + 1, 0);
  for (int t = 0; t < n; ++t) {
    uint64_t mask = 0;
    for (int j = 0; j < k; ++j) {
      const int32_t e = base[t * s0 + j * s1];
      if (e < 0 || e >= topo.num_experts) {
        return invalid_argument(fmt::format("afd dispatch: topk_ids[{}, {}] is {} but expert ids must be in 0..{}", t,
                                            j, e, topo.num_experts - 1));
      }
      for (int i = 0; i < j; ++i) {
        if (base[t * s0 + i * s1] == e) {
          return invalid_argument(fmt::format(
              "afd dispatch: topk_ids[{}] selects expert {} in slots {} and {}; a token's top-k experts must differ", t,
              e, i, j));
        }
      }
      int f = topo.ffn_of_expert(e);
      if (hoff) {
        const int32_t copies = hoff[e + 1] - hoff[e];
        f = hold[hoff[e] + static_cast<int32_t>((static_cast<uint64_t>(transfer) + out->seen[e]++) % copies)];
      }
      out->slot_ffn[static_cast<size_t>(t) * k + j] = static_cast<int8_t>(f);
      mask |= uint64_t{1} << f;
      ++out->row_offsets[f + 1];
    }
    for (int f = 0; f < F; ++f) out->token_offsets[f + 1] += (mask >> f) & 1;
  }
  for (int f = 0; f < F; ++f) {
    out->token_offsets[f + 1] += out->token_offsets[f];
    out->row_offsets[f + 1] += out->row_offsets[f];
  }
  out->tokens.resize(out->token_offsets[F]);
  out->rows_token.resize(out->row_offsets[F]);
  out->rows_slot.resize(out->row_offsets[F]);
  // Fill in token order, so each rank's tokens and rows come out ascending.
  std::vector<int32_t>& tok = out->tokens;
  int32_t tcur[kMaxFfnRanks], rcur[kMaxFfnRanks];
  for (int f = 0; f < F; ++f) {
    tcur[f] = out->token_offsets[f];
    rcur[f] = out->row_offsets[f];
  }
  for (int t = 0; t < n; ++t) {
    uint64_t mask = 0;
    for (int j = 0; j < k; ++j) {
      const int f = out->slot_ffn[static_cast<size_t>(t) * k + j];
      if (!((mask >> f) & 1)) {
        mask |= uint64_t{1} << f;
        tok[tcur[f]++] = t;
      }
      out->rows_token[rcur[f]] = t;
      out->rows_slot[rcur[f]] = j;
      ++rcur[f];
    }
  }
  return ok_status();
}

void write_sent_ids(const TensorView& ids, const DispatchLayout& layout, int t, int ffn, int32_t* out) {
  const int k = static_cast<int>(ids.dim(1));
  const int32_t* row = ids.data_as<const int32_t>() + t * ids.stride(0);
  const int8_t* owner = layout.slot_ffn.data() + static_cast<size_t>(t) * k;
  for (int j = 0; j < k; ++j) out[j] = owner[j] == ffn ? row[j * ids.stride(1)] : -1;
}

Status append_owned_rows(const int32_t* ids, int m, int k, const Topology& topo, int ffn, int layer, int token_base,
                         std::vector<int32_t>* rows_token, std::vector<int32_t>* rows_slot) {
  const int lo = topo.expert_begin(ffn), hi = topo.expert_end(ffn);
  for (int t = 0; t < m; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      if (e < 0) continue;  // another rank computes this slot
      if ((e < lo || e >= hi) && !topo.holds(layer, e, ffn)) {
        return invalid_argument(fmt::format(
            "afd: {} received a row of expert {} in layer {} (token {}, slot {}), which it does not hold",
            topo.rank_name(topo.ffn_world[ffn]), e, layer, token_base + t, j));
      }
      rows_token->push_back(token_base + t);
      rows_slot->push_back(j);
    }
  }
  return ok_status();
}

}  // namespace genbridge::afd
