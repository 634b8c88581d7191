#pragma once
// AFD configuration: a closed schema. Every rank of a job must hold the same settings; init() exchanges
// them and fails naming the first key that differs. Counts are plain integers; times are milliseconds.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "genbridge/core/status.h"

namespace genbridge::afd {

// Upper bounds that size fixed arrays in messages and metadata (checked by validate()).
inline constexpr int kMaxAttentionRanks = 64;
inline constexpr int kMaxFfnRanks = 64;
inline constexpr int kMaxStages = 3;
inline constexpr int kMaxTopK = 16;
// Ranges of the link model's settings: 10 s one way, 1 Pb/s.
inline constexpr int64_t kMaxLinkLatencyUs = 10'000'000;
inline constexpr int64_t kMaxLinkBandwidthMbps = 1'000'000'000;

enum class ConnectorKind : uint8_t { kSync, kAsync };
enum class TransportKind : uint8_t { kInproc, kMpi };

// "sync" / "async"; "inproc" / "mpi".
std::string_view connector_kind_name(ConnectorKind k);
std::string_view transport_kind_name(TransportKind k);

// One redundant copy of an expert (EPLB): FFN rank `ffn` also holds `expert` of MoE layer `layer` and computes
// a share of its rows (afd/placement.h says which).
struct ExpertReplica {
  int layer = 0;
  int expert = 0;
  int ffn = 0;
  friend bool operator==(const ExpertReplica&, const ExpertReplica&) = default;
};

struct AfdConfig {
  // Topology (JSON keys in quotes).
  int num_attention = 1;                             // "attention_ranks": A >= 1
  int num_ffn = 1;                                   // "ffn_ranks": F >= 1
  int num_stages = 1;                                // "stages": micro-batches per step, 1..3
  ConnectorKind connector = ConnectorKind::kSync;    // "connector"
  TransportKind transport = TransportKind::kInproc;  // "transport"
  bool async_dp = false;  // "async_dp": attention ranks step independently (async connector only)
  // Buffers are registered once for this many tokens per attention rank per stage.
  int max_tokens_per_stage = 256;  // "max_tokens_per_stage" >= 1
  // Deadline of every wait for something a peer owes: a transfer or control message inside a step, the
  // next step of an attention rank that has started and not finished (attention ranks step back to back
  // until they finish), the lockstep step agreement, close.
  int64_t timeout_ms = 30000;  // "timeout_ms" >= 1
  // Deadline of a rank waiting for peers that may still be busy with their own work: an attention rank that
  // finished waiting for the other attention ranks to finish (async_dp), world rank 0 gathering metrics
  // from ranks that finish at different times, and the MPI transport's close. A stuck busy rank is caught
  // sooner by the ranks it owes data (timeout_ms). Finite: every wait has a deadline.
  int64_t idle_timeout_ms = 600000;  // "idle_timeout_ms" >= 1
  // Deadline of the phases where ranks arrive far apart because each loads its weights or builds its
  // engine first: init() and an FFN rank waiting for an attention rank's first step.
  int64_t init_timeout_ms = 300000;  // "init_timeout_ms" >= 1
  // Model shape the transfers are sized from (the engine fills these from the model config).
  int num_experts = 0;  // "num_experts": E >= 1, divisible by F
  int top_k = 0;        // "top_k": 1..min(E, 16)
  int hidden_size = 0;  // "hidden_size" >= 1 (bf16 elements per token)
  // Bytes per token of a quantized MoE dispatch (runtime/device/moe_dispatch.h: codes and scales of one token);
  // 0: the dispatch carries bf16 rows (2 x hidden_size bytes). Expert outputs travel in bf16 either way.
  int dispatch_row_bytes = 0;     // "dispatch_row_bytes": 0, or a multiple of 4 above hidden_size
  int num_layers = 0;             // "num_layers" >= 1
  std::vector<int> dense_layers;  // "dense_layers": layers that stay on the attention side, ascending
  // The link model (afd/transports/link_transport.h): every transfer on the data channels arrives as if it
  // had crossed a link of this one-way latency and bandwidth. 0 and 0: no link model (the transport as is).
  int64_t link_latency_us = 0;      // "link_latency_us": 0..10000000, below 'timeout_ms'
  int64_t link_bandwidth_mbps = 0;  // "link_bandwidth_mbps": megabits per second, 0 (unlimited)..1000000000
  // Redundant experts (afd/placement.h): every MoE layer has this many extra expert copies, redundant_experts /
  // ffn_ranks on each FFN rank, listed in `replicas` (a copy on a rank that is not the expert's home, at most one
  // per rank). 0: each expert lives only on its home rank.
  int redundant_experts = 0;            // "redundant_experts": 0, or a multiple of ffn_ranks
  std::vector<ExpertReplica> replicas;  // "replicas": [[layer, expert, ffn_rank], ...], redundant_experts per MoE layer

  // Layers whose FFN runs on the FFN ranks (every layer not listed as dense), ascending.
  std::vector<int> moe_layers() const;
  int experts_per_ffn() const { return num_ffn > 0 ? num_experts / num_ffn : 0; }
  // Experts an FFN rank holds in one MoE layer: its own plus its share of the redundant copies.
  int max_experts_per_ffn() const { return experts_per_ffn() + (num_ffn > 0 ? redundant_experts / num_ffn : 0); }
  // Bytes of one token's row in a dispatch (attention -> FFN).
  int64_t dispatch_bytes_per_token() const {
    return dispatch_row_bytes > 0 ? dispatch_row_bytes : int64_t{2} * hidden_size;
  }
};

// Checks every rule; the error names the key and the rule, e.g.
// "afd config: 'stages' is 4 but must be in 1..3".
Status validate(const AfdConfig& cfg);
// One step's per-stage token counts: exactly num_stages entries, each in 0..max_tokens_per_stage. `who`
// leads the message ("afd send_step").
Status check_stage_tokens(const AfdConfig& cfg, std::span<const int> stage_tokens, std::string_view who);

// An AfdConfig that validate() accepted. Only create() makes one and nothing changes it afterwards, so
// whatever takes a ValidAfdConfig (a connector, a job) does not check it again.
class ValidAfdConfig {
 public:
  // validate(cfg)'s error, or the config.
  static Result<ValidAfdConfig> create(AfdConfig cfg);
  const AfdConfig& get() const { return cfg_; }
  const AfdConfig* operator->() const { return &cfg_; }
  operator const AfdConfig&() const { return cfg_; }  // NOLINT(google-explicit-constructor): read-only view

 private:
  explicit ValidAfdConfig(AfdConfig cfg) : cfg_(std::move(cfg)) {}
  AfdConfig cfg_;
};

// Sets the connector and what it implies: attention ranks on the async connector step independently
// (async_dp), those on the sync connector in lockstep (its control plane steps every rank together).
void set_connector(ConnectorKind kind, AfdConfig* cfg);

// Parses a JSON object with the keys above (all optional; defaults as above) and validates it.
// Unknown keys and wrong value types are errors naming the key.
Result<AfdConfig> parse_afd_config(std::string_view json_text);

// The counts of a topology string "<A>A<F>F" (e.g. "2A1F"; either letter case), or nullopt when `text` is
// not of that form (including a count that does not fit an int). The counts are not range-checked: each
// caller states its own rule.
struct TopologyCounts {
  int num_attention = 0, num_ffn = 0;
};
std::optional<TopologyCounts> parse_topology_counts(std::string_view text);

// Applies a CLI topology string "<A>A<F>F" (e.g. "2A1F") to cfg. Does not validate the rest.
Status apply_topology_string(std::string_view text, AfdConfig* cfg);

// One "key=value" line per setting, in schema order; equal strings mean equal settings. init() compares
// these across all ranks.
std::string canonical_settings(const AfdConfig& cfg);

// Compares two canonical_settings() strings; returns the first differing key, or "" when equal.
std::string first_differing_key(std::string_view a, std::string_view b, std::string* value_a, std::string* value_b);

}  // namespace genbridge::afd
