#include "afd/topology.h"

#include <fmt/format.h>

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
    return invalid_argument(fmt::format(
        "afd: {} ranks were started with --role attention and {} with --role ffn, but the config has "
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
  return t;
}

std::pair<int, int> stage_bounds(int num_tokens, int num_stages, int stage) {
  const int base = num_tokens / num_stages;
  const int extra = num_tokens % num_stages;
  const int begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

Status compute_dispatch_layout(const TensorView& ids, const Topology& topo, DispatchLayout* out) {
  const int n = static_cast<int>(ids.dim(0));
  const int k = static_cast<int>(ids.dim(1));
  const int F = topo.num_ffn;
  const int32_t* base = ids.data_as<const int32_t>();
  const int64_t s0 = ids.stride(0), s1 = ids.stride(1);
  // Per-token mask of destination ranks; ranks beyond 64 are impossible (kMaxFfnRanks).
  out->token_offsets.assign(F + 1, 0);
  out->row_offsets.assign(F + 1, 0);
  for (int t = 0; t < n; ++t) {
    uint64_t mask = 0;
    for (int j = 0; j < k; ++j) {
      const int32_t e = base[t * s0 + j * s1];
      if (e < 0 || e >= topo.num_experts) {
        return invalid_argument(fmt::format(
            "afd dispatch: topk_ids[{}, {}] is {} but expert ids must be in 0..{}", t, j, e, topo.num_experts - 1));
      }
      for (int i = 0; i < j; ++i) {
        if (base[t * s0 + i * s1] == e) {
          return invalid_argument(fmt::format(
              "afd dispatch: topk_ids[{}] selects expert {} in slots {} and {}; a token's top-k experts must differ", t,
              e, i, j));
        }
      }
      const int f = topo.ffn_of_expert(e);
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
      const int f = topo.ffn_of_expert(base[t * s0 + j * s1]);
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

void append_owned_rows(const int32_t* ids, int m, int k, const Topology& topo, int ffn, int token_base,
                       std::vector<int32_t>* rows_token, std::vector<int32_t>* rows_slot) {
  const int lo = topo.expert_begin(ffn), hi = topo.expert_end(ffn);
  for (int t = 0; t < m; ++t) {
    for (int j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      if (e >= lo && e < hi) {
        rows_token->push_back(token_base + t);
        rows_slot->push_back(j);
      }
    }
  }
}

}  // namespace genbridge::afd
