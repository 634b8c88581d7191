#include "afd/placement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>

#include "runtime/checkpoint/file_access.h"
#include "runtime/engine/npy.h"

namespace genbridge::afd {

namespace {

constexpr std::string_view kFormat = "genbridge-expert-load";
constexpr int kVersion = 1;

}  // namespace

std::string expert_load_json(const ExpertLoad& load) {
  std::string layers;
  for (size_t i = 0; i < load.layers.size(); ++i) {
    layers += fmt::format("{}\n    {{\"layer\": {}, \"rows\": [{}]}}", i ? "," : "", load.layers[i],
                          fmt::join(load.rows[i], ", "));
  }
  return fmt::format("{{\n  \"format\": \"{}\",\n  \"version\": {},\n  \"num_experts\": {},\n  \"layers\": [{}\n  ]\n}}\n",
                     kFormat, kVersion, load.num_experts, layers);
}

Result<ExpertLoad> parse_expert_load(std::string_view text, std::string_view source) {
  using json = nlohmann::json;
  const auto bad = [&](const std::string& why) {
    return invalid_argument(fmt::format("expert load {}: {}", source, why));
  };
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) {
    return bad(fmt::format("'format' must be \"{}\" (written by genbridge run --afd-expert-load-out)", kFormat));
  }
  if (!j.contains("version") || j["version"] != kVersion) {
    return bad(fmt::format("'version' must be {}, got {}", kVersion, j.value("version", json()).dump()));
  }
  ExpertLoad load;
  load.source = std::string(source);
  const json& e = j.value("num_experts", json());
  if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > (1 << 20)) {
    return bad(fmt::format("'num_experts' must be an integer in 1..{}, got {}", 1 << 20, e.dump()));
  }
  load.num_experts = e.get<int>();
  const json& layers = j.value("layers", json());
  if (!layers.is_array() || layers.empty()) return bad("'layers' must be a non-empty array");
  for (const json& l : layers) {
    if (!l.is_object() || !l.contains("layer") || !l["layer"].is_number_integer() || !l.contains("rows") ||
        !l["rows"].is_array()) {
      return bad(fmt::format("each entry of 'layers' must be {{\"layer\": int, \"rows\": [...]}}, got {}",
                             l.dump().substr(0, 200)));
    }
    const int64_t layer = l["layer"].get<int64_t>();
    if (layer < 0 || layer > std::numeric_limits<int>::max() ||
        (!load.layers.empty() && layer <= load.layers.back())) {
      return bad(fmt::format("layer {} is negative or not above the previous entry's; layers must ascend", layer));
    }
    const json& rows = l["rows"];
    if (rows.size() != static_cast<size_t>(load.num_experts)) {
      return bad(fmt::format("layer {} has {} row counts but 'num_experts' is {}", layer, rows.size(),
                             load.num_experts));
    }
    std::vector<int64_t> r;
    r.reserve(rows.size());
    for (const json& x : rows) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) {
        return bad(fmt::format("layer {}: row counts must be integers >= 0, got {}", layer, x.dump()));
      }
      r.push_back(x.get<int64_t>());
    }
    load.layers.push_back(static_cast<int>(layer));
    load.rows.push_back(std::move(r));
  }
  return load;
}

Result<ExpertLoad> read_expert_load(const std::filesystem::path& path) {
  Result<std::string> text = model::detail::read_regular_file(path);
  if (!text.ok()) {
    return Status(text.status().code(), fmt::format("expert load: {}", text.status().message()));  // names the path
  }
  return parse_expert_load(*text, path.string());
}

Status write_expert_load(const std::filesystem::path& path, const ExpertLoad& load) {
  const std::string text = expert_load_json(load);
  const std::span<const std::byte> part(reinterpret_cast<const std::byte*>(text.data()), text.size());
  return engine::write_output_file("--afd-expert-load-out", path.string(), {&part, 1});
}

Result<std::vector<ExpertReplica>> plan_replicas(const AfdConfig& cfg, const ExpertLoad& load) {
  const std::string& source = load.source;
  const std::vector<int> layers = cfg.moe_layers();
  const int E = cfg.num_experts, F = cfg.num_ffn, N = cfg.redundant_experts;
  if (load.num_experts != E) {
    return invalid_argument(fmt::format("expert load {} counts {} experts but the model has {}", source,
                                        load.num_experts, E));
  }
  if (load.layers != layers) {
    return invalid_argument(fmt::format("expert load {} covers MoE layers [{}] but the model's are [{}]", source,
                                        fmt::join(load.layers, ", "), fmt::join(layers, ", ")));
  }
  if (F < 1 || E % F != 0 || N < 0 || N % F != 0 || N > E * (F - 1)) {
    return invalid_argument(fmt::format(
        "--afd-redundant-experts {}: must be a multiple of the {} FFN ranks in 0..{} (each rank holds the same number "
        "of copies, at most one copy of an expert per rank)",
        N, F, E * (F - 1)));
  }
  const int per_ffn = E / F;
  std::vector<ExpertReplica> out;
  out.reserve(static_cast<size_t>(N) * layers.size());
  for (size_t li = 0; li < layers.size(); ++li) {
    const std::vector<int64_t>& rows = load.rows[li];
    std::vector<int> copies(static_cast<size_t>(E), 1);
    std::vector<std::vector<uint8_t>> holds(static_cast<size_t>(E), std::vector<uint8_t>(static_cast<size_t>(F), 0));
    std::vector<int> free_slots(static_cast<size_t>(F), N / F);
    for (int e = 0; e < E; ++e) holds[e][e / per_ffn] = 1;
    // rows[a] / copies[a] > rows[b] / copies[b], exactly (no rounding); ties: the lower expert id.
    const auto heavier = [&](int a, int b) {
      const __int128 x = static_cast<__int128>(rows[a]) * copies[b], y = static_cast<__int128>(rows[b]) * copies[a];
      return x != y ? x > y : a < b;
    };
    // A rank's load: the rows per copy of every expert it holds.
    const auto rank_load = [&](int f) {
      double sum = 0;
      for (int e = 0; e < E; ++e) {
        if (holds[e][f]) sum += static_cast<double>(rows[e]) / copies[e];
      }
      return sum;
    };
    for (int n = 0; n < N; ++n) {
      // The heaviest expert that some rank with a free slot does not hold yet. One exists: a rank with a free
      // slot holds fewer than E / F + N / F <= E experts.
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool placeable = false;
        for (int f = 0; f < F && !placeable; ++f) placeable = free_slots[f] > 0 && !holds[e][f];
        if (placeable && (best < 0 || heavier(e, best))) best = e;
      }
      int to = -1;
      double to_load = 0;
      for (int f = 0; f < F; ++f) {
        if (free_slots[f] == 0 || holds[best][f]) continue;
        const double l = rank_load(f);
        if (to < 0 || l < to_load) {
          to = f;
          to_load = l;
        }
      }
      holds[best][to] = 1;
      ++copies[best];
      --free_slots[to];
      out.push_back({layers[li], best, to});
    }
  }
  return out;
}

ExpertLoad measured_expert_load(const AfdReport& report, const model::ModelConfig& model) {
  ExpertLoad load;
  load.num_experts = static_cast<int>(model.num_experts);
  for (int64_t l = 0; l < model.num_hidden_layers; ++l) {
    if (model.is_moe_layer(l)) load.layers.push_back(static_cast<int>(l));
  }
  for (int l : load.layers) {
    std::vector<int64_t> rows(static_cast<size_t>(load.num_experts), 0);
    if (static_cast<size_t>(l) < report.layer_expert_rows.size()) {
      const std::vector<int64_t>& r = report.layer_expert_rows[static_cast<size_t>(l)];
      std::copy_n(r.begin(), std::min(r.size(), rows.size()), rows.begin());
    }
    load.rows.push_back(std::move(rows));
  }
  return load;
}

std::vector<double> planned_rank_rows(const AfdConfig& cfg, const ExpertLoad& load, int layer_index) {
  const int E = cfg.num_experts, F = cfg.num_ffn, per_ffn = cfg.experts_per_ffn();
  const int layer = load.layers[static_cast<size_t>(layer_index)];
  std::vector<int> copies(static_cast<size_t>(E), 1);
  for (const ExpertReplica& r : cfg.replicas) {
    if (r.layer == layer) ++copies[r.expert];
  }
  std::vector<double> out(static_cast<size_t>(F), 0.0);
  const std::vector<int64_t>& rows = load.rows[static_cast<size_t>(layer_index)];
  for (int e = 0; e < E; ++e) out[e / per_ffn] += static_cast<double>(rows[e]) / copies[e];
  for (const ExpertReplica& r : cfg.replicas) {
    if (r.layer == layer) out[r.ffn] += static_cast<double>(rows[r.expert]) / copies[r.expert];
  }
  return out;
}

}  // namespace genbridge::afd
