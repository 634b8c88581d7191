#include "afd/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

#include "afd/transports/link_transport.h"

namespace genbridge::afd {

std::string_view connector_kind_name(ConnectorKind k) { return k == ConnectorKind::kSync ? "sync" : "async"; }
std::string_view transport_kind_name(TransportKind k) { return k == TransportKind::kInproc ? "inproc" : "mpi"; }

std::vector<int> AfdConfig::moe_layers() const {
  std::vector<int> out;
  for (int l = 0; l < num_layers; ++l) {
    if (!std::binary_search(dense_layers.begin(), dense_layers.end(), l)) out.push_back(l);
  }
  return out;
}

namespace {

Status rule(std::string_view key, std::string_view got, std::string_view must) {
  return invalid_argument(fmt::format("afd config: '{}' is {} but {}", key, got, must));
}

// 'redundant_experts' and 'replicas' (after the model-shape keys were checked).
Status validate_replicas(const AfdConfig& c) {
  const int N = c.redundant_experts, F = c.num_ffn, E = c.num_experts;
  if (N < 0 || N % F != 0 || N > E * (F - 1)) {
    return rule("redundant_experts", std::to_string(N),
                fmt::format("must be a multiple of 'ffn_ranks' ({}) in 0..{} (every FFN rank holds the same number of "
                            "copies, at most one copy of an expert per rank)",
                            F, E * (F - 1)));
  }
  const std::vector<int> layers = c.moe_layers();
  if (c.replicas.size() != static_cast<size_t>(N) * layers.size()) {
    return invalid_argument(fmt::format(
        "afd config: 'replicas' lists {} copies but 'redundant_experts' {} x {} MoE layers needs {}", c.replicas.size(),
        N, layers.size(), static_cast<size_t>(N) * layers.size()));
  }
  // Per MoE layer: copies per FFN rank, and which (expert, rank) pairs are taken.
  std::vector<int> moe_index(static_cast<size_t>(c.num_layers), -1);
  for (size_t i = 0; i < layers.size(); ++i) moe_index[static_cast<size_t>(layers[i])] = static_cast<int>(i);
  std::vector<int> per_rank(layers.size() * static_cast<size_t>(F), 0);
  std::vector<uint8_t> held(layers.size() * static_cast<size_t>(E) * static_cast<size_t>(F), 0);
  for (const ExpertReplica& r : c.replicas) {
    const std::string what = fmt::format("[{}, {}, {}]", r.layer, r.expert, r.ffn);
    if (r.layer < 0 || r.layer >= c.num_layers || moe_index[static_cast<size_t>(r.layer)] < 0) {
      return rule("replicas", what, "must name a MoE layer (dense layers have no experts)");
    }
    if (r.expert < 0 || r.expert >= E) return rule("replicas", what, fmt::format("must name an expert in 0..{}", E - 1));
    if (r.ffn < 0 || r.ffn >= F) return rule("replicas", what, fmt::format("must name an FFN rank in 0..{}", F - 1));
    if (r.ffn == r.expert / c.experts_per_ffn()) {
      return rule("replicas", what, fmt::format("copies expert {} onto its home FFN rank {}", r.expert, r.ffn));
    }
    const size_t li = static_cast<size_t>(moe_index[static_cast<size_t>(r.layer)]);
    uint8_t& h = held[(li * static_cast<size_t>(E) + static_cast<size_t>(r.expert)) * static_cast<size_t>(F) +
                      static_cast<size_t>(r.ffn)];
    if (h != 0) return rule("replicas", what, "is listed twice");
    h = 1;
    if (++per_rank[li * static_cast<size_t>(F) + static_cast<size_t>(r.ffn)] > N / F) {
      return rule("replicas", what,
                  fmt::format("gives FFN rank {} more than 'redundant_experts' / 'ffn_ranks' = {} copies in layer {}",
                              r.ffn, N / F, r.layer));
    }
  }
  return ok_status();
}

}  // namespace

Status validate(const AfdConfig& c) {
  if (c.num_attention < 1 || c.num_attention > kMaxAttentionRanks) {
    return rule("attention_ranks", std::to_string(c.num_attention),
                fmt::format("must be in 1..{} (A, the number of attention ranks)", kMaxAttentionRanks));
  }
  if (c.num_ffn < 1 || c.num_ffn > kMaxFfnRanks) {
    return rule("ffn_ranks", std::to_string(c.num_ffn),
                fmt::format("must be in 1..{} (F, the number of FFN ranks)", kMaxFfnRanks));
  }
  if (c.num_stages < 1 || c.num_stages > kMaxStages) {
    return rule("stages", std::to_string(c.num_stages), fmt::format("must be in 1..{}", kMaxStages));
  }
  if (c.async_dp && c.connector != ConnectorKind::kAsync) {
    return invalid_argument(
        "afd config: 'async_dp' is true but 'connector' is \"sync\"; asynchronous data parallelism (attention ranks "
        "stepping independently) needs the async connector, because the sync connector's control plane runs every "
        "attention rank in lockstep");
  }
  if (c.max_tokens_per_stage < 1) {
    return rule("max_tokens_per_stage", std::to_string(c.max_tokens_per_stage), "must be >= 1");
  }
  if (c.timeout_ms < 1) return rule("timeout_ms", std::to_string(c.timeout_ms), "must be >= 1");
  if (c.init_timeout_ms < 1) return rule("init_timeout_ms", std::to_string(c.init_timeout_ms), "must be >= 1");
  if (c.idle_timeout_ms < 1) {
    return rule("idle_timeout_ms", std::to_string(c.idle_timeout_ms), "must be >= 1 (every wait has a deadline)");
  }
  if (c.num_experts < 1) return rule("num_experts", std::to_string(c.num_experts), "must be >= 1");
  if (c.num_experts % c.num_ffn != 0) {
    return invalid_argument(fmt::format(
        "afd config: 'num_experts' is {} but must be divisible by 'ffn_ranks' ({}) so that every FFN rank owns the "
        "same number of experts",
        c.num_experts, c.num_ffn));
  }
  if (c.top_k < 1 || c.top_k > std::min(c.num_experts, kMaxTopK)) {
    return rule("top_k", std::to_string(c.top_k),
                fmt::format("must be in 1..{} (at most num_experts and at most {})", std::min(c.num_experts, kMaxTopK),
                            kMaxTopK));
  }
  if (c.hidden_size < 1) return rule("hidden_size", std::to_string(c.hidden_size), "must be >= 1");
  if (c.dispatch_row_bytes != 0 && (c.dispatch_row_bytes <= c.hidden_size || c.dispatch_row_bytes % 4 != 0)) {
    return rule("dispatch_row_bytes", std::to_string(c.dispatch_row_bytes),
                fmt::format("must be 0 (bf16 rows) or a multiple of 4 above 'hidden_size' ({}): a quantized row holds "
                            "one byte per element and its scales",
                            c.hidden_size));
  }
  if (c.num_layers < 1) return rule("num_layers", std::to_string(c.num_layers), "must be >= 1");
  for (size_t i = 0; i < c.dense_layers.size(); ++i) {
    const int l = c.dense_layers[i];
    if (l < 0 || l >= c.num_layers) {
      return invalid_argument(
          fmt::format("afd config: 'dense_layers' contains {} but layers are 0..{}", l, c.num_layers - 1));
    }
    if (i > 0 && l <= c.dense_layers[i - 1]) {
      return invalid_argument(fmt::format("afd config: 'dense_layers' must be strictly ascending, but {} follows {}", l,
                                          c.dense_layers[i - 1]));
    }
  }
  if (static_cast<int>(c.dense_layers.size()) == c.num_layers) {
    return invalid_argument(fmt::format(
        "afd config: 'dense_layers' lists all {} layers; AFD needs at least one MoE layer for the FFN ranks",
        c.num_layers));
  }
  GB_RETURN_IF_ERROR(validate_replicas(c));
  // Every message must fit one MPI count (int bytes): the largest is a stage's expert outputs.
  const int64_t max_slots = std::min(c.top_k, c.max_experts_per_ffn());
  const int64_t result_bytes = int64_t{c.max_tokens_per_stage} * max_slots * c.hidden_size * 2;
  const int64_t work_bytes = int64_t{c.max_tokens_per_stage} * (c.dispatch_bytes_per_token() + 8 * c.top_k);
  const int64_t largest_bytes = std::max(result_bytes, work_bytes);
  if (largest_bytes > (int64_t{1} << 30)) {
    return invalid_argument(
        fmt::format("afd config: 'max_tokens_per_stage' is {} but one stage's transfer would need {} bytes "
                    "(tokens x min(top_k, experts per FFN rank) x hidden_size x 2); the limit is 1 GiB per message",
                    c.max_tokens_per_stage, largest_bytes));
  }
  if (c.link_latency_us < 0 || c.link_latency_us > kMaxLinkLatencyUs) {
    return rule("link_latency_us", std::to_string(c.link_latency_us),
                fmt::format("must be in 0..{} (microseconds)", kMaxLinkLatencyUs));
  }
  if (c.link_bandwidth_mbps < 0 || c.link_bandwidth_mbps > kMaxLinkBandwidthMbps) {
    return rule("link_bandwidth_mbps", std::to_string(c.link_bandwidth_mbps),
                fmt::format("must be in 0..{} (megabits per second; 0: unlimited)", kMaxLinkBandwidthMbps));
  }
  // A transfer the link model delays past the deadline of every wait would end each step with an error.
  const LinkModel link = link_model_of(c);
  const int64_t slowest_ns = link.latency_us * 1000 + link.wire_ns(static_cast<size_t>(largest_bytes));
  if (link.enabled() && static_cast<double>(slowest_ns) >= static_cast<double>(c.timeout_ms) * 1e6) {
    return invalid_argument(fmt::format(
        "afd config: over the link model ('link_latency_us' {}, 'link_bandwidth_mbps' {}) one stage's largest "
        "transfer ({} bytes) would take {:.3f} ms, at least 'timeout_ms' ({})",
        c.link_latency_us, c.link_bandwidth_mbps, largest_bytes, slowest_ns / 1e6, c.timeout_ms));
  }
  return ok_status();
}

Status check_stage_tokens(const AfdConfig& cfg, std::span<const int> stage_tokens, std::string_view who) {
  const int S = cfg.num_stages;
  if (static_cast<int>(stage_tokens.size()) != S) {
    return invalid_argument(
        fmt::format("{}: {} stage token counts given but 'stages' is {}", who, stage_tokens.size(), S));
  }
  for (int s = 0; s < S; ++s) {
    if (stage_tokens[s] < 0 || stage_tokens[s] > cfg.max_tokens_per_stage) {
      return invalid_argument(fmt::format("{}: stage {} has {} tokens but must have 0..{} ('max_tokens_per_stage')",
                                          who, s, stage_tokens[s], cfg.max_tokens_per_stage));
    }
  }
  return ok_status();
}

Result<ValidAfdConfig> ValidAfdConfig::create(AfdConfig cfg) {
  GB_RETURN_IF_ERROR(validate(cfg));
  return ValidAfdConfig(std::move(cfg));
}

void set_connector(ConnectorKind kind, AfdConfig* cfg) {
  cfg->connector = kind;
  cfg->async_dp = kind == ConnectorKind::kAsync;
}

namespace {

using json = nlohmann::json;

Status read_int(const json& j, std::string_view key, int64_t lo, int64_t hi, int64_t* out) {
  if (!j.is_number_integer()) {
    return invalid_argument(fmt::format("afd config: '{}' must be an integer, got {}", key, j.dump()));
  }
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) {
    return invalid_argument(fmt::format("afd config: '{}' is {} but must be in {}..{}", key, v, lo, hi));
  }
  *out = v;
  return ok_status();
}

// The integer keys: JSON key, field (an int or an int64_t field; the other is null). Ranges are validate()'s.
struct IntKey {
  std::string_view key;
  int AfdConfig::*int_field;
  int64_t AfdConfig::*int64_field;
};
constexpr IntKey kIntKeys[] = {
    {"attention_ranks", &AfdConfig::num_attention, nullptr},
    {"ffn_ranks", &AfdConfig::num_ffn, nullptr},
    {"stages", &AfdConfig::num_stages, nullptr},
    {"max_tokens_per_stage", &AfdConfig::max_tokens_per_stage, nullptr},
    {"timeout_ms", nullptr, &AfdConfig::timeout_ms},
    {"idle_timeout_ms", nullptr, &AfdConfig::idle_timeout_ms},
    {"init_timeout_ms", nullptr, &AfdConfig::init_timeout_ms},
    {"num_experts", &AfdConfig::num_experts, nullptr},
    {"top_k", &AfdConfig::top_k, nullptr},
    {"hidden_size", &AfdConfig::hidden_size, nullptr},
    {"dispatch_row_bytes", &AfdConfig::dispatch_row_bytes, nullptr},
    {"num_layers", &AfdConfig::num_layers, nullptr},
    {"link_latency_us", nullptr, &AfdConfig::link_latency_us},
    {"link_bandwidth_mbps", nullptr, &AfdConfig::link_bandwidth_mbps},
    {"redundant_experts", &AfdConfig::redundant_experts, nullptr},
};

// One key that is not an integer: "connector", "transport", "async_dp" or "dense_layers".
Status read_other_key(const std::string& key, const json& v, AfdConfig* c) {
  constexpr int64_t kIntMin = std::numeric_limits<int>::min(), kIntMax = std::numeric_limits<int>::max();
  if (key == "connector") {
    if (v != "sync" && v != "async") {
      return invalid_argument(fmt::format("afd config: 'connector' is {} but must be \"sync\" or \"async\"", v.dump()));
    }
    c->connector = v == "sync" ? ConnectorKind::kSync : ConnectorKind::kAsync;
  } else if (key == "transport") {
    if (v != "inproc" && v != "mpi") {
      return invalid_argument(fmt::format("afd config: 'transport' is {} but must be \"inproc\" or \"mpi\"", v.dump()));
    }
    c->transport = v == "inproc" ? TransportKind::kInproc : TransportKind::kMpi;
  } else if (key == "async_dp") {
    if (!v.is_boolean()) {
      return invalid_argument(fmt::format("afd config: 'async_dp' must be true or false, got {}", v.dump()));
    }
    c->async_dp = v.get<bool>();
  } else if (key == "dense_layers") {
    if (!v.is_array()) {
      return invalid_argument(
          fmt::format("afd config: 'dense_layers' must be an array of layer indices, got {}", v.dump()));
    }
    c->dense_layers.clear();
    for (const json& e : v) {
      int64_t n = 0;
      GB_RETURN_IF_ERROR(read_int(e, "dense_layers[]", kIntMin, kIntMax, &n));
      c->dense_layers.push_back(static_cast<int>(n));
    }
  } else if (key == "replicas") {
    if (!v.is_array()) {
      return invalid_argument(fmt::format(
          "afd config: 'replicas' must be an array of [layer, expert, ffn_rank] triples, got {}", v.dump()));
    }
    c->replicas.clear();
    for (const json& e : v) {
      if (!e.is_array() || e.size() != 3) {
        return invalid_argument(
            fmt::format("afd config: each entry of 'replicas' must be [layer, expert, ffn_rank], got {}", e.dump()));
      }
      int64_t n[3] = {};
      for (size_t i = 0; i < 3; ++i) GB_RETURN_IF_ERROR(read_int(e[i], "replicas[][]", kIntMin, kIntMax, &n[i]));
      c->replicas.push_back({static_cast<int>(n[0]), static_cast<int>(n[1]), static_cast<int>(n[2])});
    }
  } else {
    return invalid_argument(fmt::format(
        "afd config: unknown key '{}' (known keys: attention_ranks, ffn_ranks, stages, connector, transport, "
        "async_dp, max_tokens_per_stage, timeout_ms, idle_timeout_ms, init_timeout_ms, num_experts, top_k, "
        "hidden_size, dispatch_row_bytes, num_layers, dense_layers, link_latency_us, link_bandwidth_mbps, "
        "redundant_experts, replicas)",
        key));
  }
  return ok_status();
}

}  // namespace

Result<AfdConfig> parse_afd_config(std::string_view json_text) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid_argument("afd config: the text is not valid JSON");
  if (!j.is_object()) return invalid_argument(fmt::format("afd config: must be a JSON object, got {}", j.type_name()));
  AfdConfig c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const IntKey* k =
        std::find_if(std::begin(kIntKeys), std::end(kIntKeys), [&](const IntKey& i) { return i.key == key; });
    if (k == std::end(kIntKeys)) {
      GB_RETURN_IF_ERROR(read_other_key(key, it.value(), &c));
      continue;
    }
    int64_t n = 0;
    if (k->int_field) {
      GB_RETURN_IF_ERROR(
          read_int(it.value(), key, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), &n));
      c.*(k->int_field) = static_cast<int>(n);
    } else {
      GB_RETURN_IF_ERROR(
          read_int(it.value(), key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &n));
      c.*(k->int64_field) = n;
    }
  }
  GB_RETURN_IF_ERROR(validate(c));
  return c;
}

std::optional<TopologyCounts> parse_topology_counts(std::string_view text) {
  const char* end = text.data() + text.size();
  TopologyCounts t;
  const auto r1 = std::from_chars(text.data(), end, t.num_attention);
  if (r1.ec != std::errc() || r1.ptr == end || (*r1.ptr != 'A' && *r1.ptr != 'a')) return std::nullopt;
  const auto r2 = std::from_chars(r1.ptr + 1, end, t.num_ffn);
  if (r2.ec != std::errc() || r2.ptr + 1 != end || (*r2.ptr != 'F' && *r2.ptr != 'f')) return std::nullopt;
  return t;
}

Status apply_topology_string(std::string_view text, AfdConfig* cfg) {
  const std::optional<TopologyCounts> t = parse_topology_counts(text);
  if (!t || t->num_attention <= 0 || t->num_ffn <= 0) {
    return invalid_argument(fmt::format(
        "afd topology '{}' must look like <A>A<F>F with positive counts, e.g. \"2A1F\" for 2 attention ranks and 1 "
        "FFN rank",
        text));
  }
  cfg->num_attention = t->num_attention;
  cfg->num_ffn = t->num_ffn;
  return ok_status();
}

std::string canonical_settings(const AfdConfig& c) {
  std::string dense;
  for (size_t i = 0; i < c.dense_layers.size(); ++i) dense += (i ? "," : "") + std::to_string(c.dense_layers[i]);
  std::string replicas;
  for (const ExpertReplica& r : c.replicas) {
    replicas += fmt::format("{}[{},{},{}]", replicas.empty() ? "" : ",", r.layer, r.expert, r.ffn);
  }
  return fmt::format(
      "attention_ranks={}\nffn_ranks={}\nstages={}\nconnector={}\ntransport={}\nasync_dp={}\nmax_tokens_per_stage={}\n"
      "timeout_ms={}\nidle_timeout_ms={}\ninit_timeout_ms={}\nnum_experts={}\ntop_k={}\nhidden_size={}\n"
      "dispatch_row_bytes={}\nnum_layers={}\ndense_layers=[{}]\nlink_latency_us={}\nlink_bandwidth_mbps={}\n"
      "redundant_experts={}\nreplicas=[{}]\n",
      c.num_attention, c.num_ffn, c.num_stages, connector_kind_name(c.connector), transport_kind_name(c.transport),
      c.async_dp ? "true" : "false", c.max_tokens_per_stage, c.timeout_ms, c.idle_timeout_ms, c.init_timeout_ms,
      c.num_experts, c.top_k, c.hidden_size, c.dispatch_row_bytes, c.num_layers, dense, c.link_latency_us,
      c.link_bandwidth_mbps, c.redundant_experts, replicas);
}

std::string first_differing_key(std::string_view a, std::string_view b, std::string* value_a, std::string* value_b) {
  auto next_line = [](std::string_view& s) {
    const size_t nl = s.find('\n');
    std::string_view line = s.substr(0, nl);
    s = nl == std::string_view::npos ? std::string_view() : s.substr(nl + 1);
    return line;
  };
  while (!a.empty() || !b.empty()) {
    const std::string_view la = next_line(a);
    const std::string_view lb = next_line(b);
    if (la == lb) continue;
    const std::string_view ka = la.substr(0, la.find('='));
    const std::string_view kb = lb.substr(0, lb.find('='));
    if (value_a)
      *value_a = la.find('=') == std::string_view::npos ? std::string() : std::string(la.substr(la.find('=') + 1));
    if (value_b)
      *value_b = lb.find('=') == std::string_view::npos ? std::string() : std::string(lb.substr(lb.find('=') + 1));
    return std::string(ka.empty() ? kb : ka);
  }
  return std::string();
}

}  // namespace genbridge::afd
