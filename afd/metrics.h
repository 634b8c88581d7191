#pragma once
// AFD observability, with the definitions of the published AFD work so numbers compare:
//  * per-layer, per-stage attention->FFN and FFN->attention latency (p50/p99) and bytes. A transfer's
//    latency runs from the sender posting it to the receiver holding it (steady clock; the ranks of one
//    host share it, across hosts the value includes the clocks' offset);
//  * FFN busy fraction: time in the expert compute callback / the FFN rank's wall time;
//  * attention idle fraction: time blocked waiting for expert outputs / the attention rank's wall time;
//  * prefill and decode steps counted apart, with the engine's token counts (a prefill step's tokens are
//    prompt tokens, a decode step's one per running request); decode tokens/s per rank: decode tokens of
//    all attention ranks / the longest attention rank's time in decode steps / (A + F), so every rank is
//    counted (the engine's table divides its decode tokens by its decode time the same way); TPOT = decode
//    step time, mean and p99 (prefill steps are reported apart);
//  * a Chrome/Perfetto trace of attention, FFN, transfer and wait spans per rank.
// Each rank records into its own Metrics (no locking, no allocation except trace events beyond the
// reserved capacity); rank 0 merges them after Connector::gather().

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "afd/config.h"
#include "afd/transport.h"
#include "genbridge/core/status.h"

namespace genbridge::afd {

// Steady clock in nanoseconds.
int64_t now_ns();

// Log-linear latency histogram (16 linear sub-buckets per power of two: values within 6.25%).
// Mergeable; fixed size; no allocation.
class LatencyHistogram {
 public:
  static constexpr int kSubBuckets = 16;
  static constexpr int kOctaves = 44;  // up to 2^44 ns (about 4.9 hours)
  static constexpr int kBuckets = kSubBuckets * kOctaves;

  void record(int64_t ns);
  void merge(const LatencyHistogram& o);
  int64_t count() const { return count_; }
  int64_t sum_ns() const { return sum_ns_; }
  double mean_ns() const { return count_ ? static_cast<double>(sum_ns_) / static_cast<double>(count_) : 0.0; }
  // Value at percentile p in [0, 100] (bucket midpoint, clamped to the observed min/max); 0 when empty.
  double percentile_ns(double p) const;
  const std::array<int64_t, kBuckets>& buckets() const { return buckets_; }

 private:
  friend class Metrics;
  std::array<int64_t, kBuckets> buckets_{};
  int64_t count_ = 0;
  int64_t sum_ns_ = 0;
  int64_t min_ns_ = 0;
  int64_t max_ns_ = 0;
};

enum class Direction : uint8_t { kAttnToFfn = 0, kFfnToAttn = 1 };
// What an attention rank's step does: prefill (prompts of newly admitted requests) or decode (one token
// per running request).
enum class StepPhase : uint8_t { kPrefill = 0, kDecode = 1 };
enum class SpanKind : uint8_t { kAttention = 0, kFfn = 1, kTransfer = 2, kWait = 3 };

struct TraceEvent {
  int64_t begin_ns;
  int64_t end_ns;
  int64_t step;
  int32_t peer;  // world rank of the other side (transfers, waits), or -1
  int16_t layer;
  int8_t stage;
  SpanKind kind;
};

struct TransferStats {
  LatencyHistogram latency;
  int64_t bytes = 0;
  int64_t messages = 0;
};

class Metrics {
 public:
  Metrics() = default;
  // Sized for cfg.num_layers x cfg.num_stages; `max_trace_events` > 0 enables the trace (events are
  // reserved up front; beyond the capacity they are counted as dropped).
  Metrics(const AfdConfig& cfg, int world_rank, Role role, int role_rank, size_t max_trace_events = 0);

  // Recording can be paused (warm-up steps are not measured).
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  bool tracing() const { return recording_ && trace_capacity_ > 0; }

  void record_transfer(Direction d, int layer, int stage, int64_t latency_ns, int64_t bytes);
  void add_busy_ns(int64_t ns) {
    if (recording_) busy_ns_ += ns;
  }
  void add_idle_ns(int64_t ns) {
    if (recording_) idle_ns_ += ns;
  }
  // One attention step of `tokens` tokens (an empty step, e.g. an idle lockstep rank's, is not counted). A
  // warm-up step (recording paused) is only counted as such, so that the report still adds up to the
  // engine's token counts.
  void record_step(StepPhase phase, int64_t tokens, int64_t ns) {
    if (tokens <= 0) return;
    if (!recording_) {
      ++warmup_steps_;
      (phase == StepPhase::kPrefill ? warmup_prefill_tokens_ : warmup_decode_tokens_) += tokens;
      return;
    }
    (phase == StepPhase::kPrefill ? prefill_tokens_ : decode_tokens_) += tokens;
    (phase == StepPhase::kPrefill ? prefill_step_ : decode_step_).record(ns);
  }
  // FFN ranks: time computing the experts of `layer` (also counted in busy_ns()).
  void add_layer_busy_ns(int layer, int64_t ns) {
    if (!recording_ || layer < 0 || layer >= num_layers_ || layer_busy_ns_.empty()) return;
    layer_busy_ns_[static_cast<size_t>(layer)] += ns;
  }
  const std::vector<int64_t>& layer_busy_ns() const { return layer_busy_ns_; }
  // FFN ranks: `rows` (token, slot) rows of expert `expert` in `layer` computed (the expert load; warm-up steps
  // not counted). Ignored outside the model's layers and experts.
  void add_expert_rows(int layer, int expert, int64_t rows) {
    if (!recording_ || expert < 0 || expert >= num_experts_ || layer < 0 || layer >= num_layers_) return;
    layer_expert_rows_[static_cast<size_t>(layer) * num_experts_ + expert] += rows;
    expert_rows_[static_cast<size_t>(expert)] += rows;
  }
  // Rows per expert id summed over layers (an FFN rank's has an entry for every expert of the model; an
  // attention rank's is empty), and per layer: [num_layers x num_experts], row-major.
  const std::vector<int64_t>& expert_rows() const { return expert_rows_; }
  const std::vector<int64_t>& layer_expert_rows() const { return layer_expert_rows_; }
  int num_experts() const { return num_experts_; }
  // Extends the measured wall-time window [begin, end] of this rank.
  void mark_window(int64_t begin_ns, int64_t end_ns);
  void span(SpanKind kind, int64_t begin_ns, int64_t end_ns, int layer, int stage, int64_t step, int peer);

  int world_rank() const { return world_rank_; }
  Role role() const { return role_; }
  int role_rank() const { return role_rank_; }
  int num_layers() const { return num_layers_; }
  int num_stages() const { return num_stages_; }
  const TransferStats& transfer(Direction d, int layer, int stage) const;
  int64_t busy_ns() const { return busy_ns_; }
  int64_t idle_ns() const { return idle_ns_; }
  int64_t prefill_tokens() const { return prefill_tokens_; }
  int64_t decode_tokens() const { return decode_tokens_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t warmup_prefill_tokens() const { return warmup_prefill_tokens_; }
  int64_t warmup_decode_tokens() const { return warmup_decode_tokens_; }
  int64_t wall_begin_ns() const { return wall_begin_ns_; }
  int64_t wall_end_ns() const { return wall_end_ns_; }
  int64_t wall_ns() const { return wall_end_ns_ > wall_begin_ns_ ? wall_end_ns_ - wall_begin_ns_ : 0; }
  const LatencyHistogram& prefill_step_latency() const { return prefill_step_; }
  const LatencyHistogram& decode_step_latency() const { return decode_step_; }
  std::span<const TraceEvent> events() const { return events_; }
  int64_t dropped_events() const { return dropped_events_; }

  // Binary form for Connector::gather (same build on every rank).
  std::string serialize() const;
  static Result<Metrics> deserialize(std::string_view bytes);

 private:
  int index(Direction d, int layer, int stage) const {
    return (static_cast<int>(d) * num_layers_ + layer) * num_stages_ + stage;
  }
  bool recording_ = true;
  int world_rank_ = 0;
  Role role_ = Role::kAttention;
  int role_rank_ = 0;
  int num_layers_ = 0;
  int num_stages_ = 0;
  std::vector<TransferStats> transfers_;
  int64_t busy_ns_ = 0;
  int64_t idle_ns_ = 0;
  int64_t prefill_tokens_ = 0;
  int64_t decode_tokens_ = 0;
  int64_t warmup_steps_ = 0;
  int64_t warmup_prefill_tokens_ = 0;
  int64_t warmup_decode_tokens_ = 0;
  int64_t wall_begin_ns_ = 0;
  int64_t wall_end_ns_ = 0;
  LatencyHistogram prefill_step_;
  LatencyHistogram decode_step_;
  size_t trace_capacity_ = 0;
  std::vector<TraceEvent> events_;
  int64_t dropped_events_ = 0;
  int num_experts_ = 0;                    // FFN ranks: the model's; attention ranks: 0
  std::vector<int64_t> layer_expert_rows_;  // [num_layers x num_experts]
  std::vector<int64_t> expert_rows_;        // layer_expert_rows_ summed over layers (read per FFN work item)
  std::vector<int64_t> layer_busy_ns_;      // FFN ranks: [num_layers]
};

// The job-wide summary computed from every rank's Metrics.
struct AfdReport {
  struct Link {
    int layer, stage;
    Direction direction;
    double p50_us, p99_us;
    int64_t bytes, messages;
  };
  std::vector<Link> links;             // per (direction, layer, stage) with at least one message
  std::vector<double> ffn_busy;        // per FFN rank
  std::vector<double> attention_idle;  // per attention rank
  // Expert load (measured steps, every MoE layer together): rows (token, slot pairs) computed per expert id and
  // per FFN rank; the max / mean ratios over the FFN ranks and over the experts (1 = perfectly even; 0 when no
  // row was computed).
  std::vector<int64_t> expert_rows, ffn_rows;
  std::vector<std::vector<int64_t>> layer_expert_rows;  // [layer][expert]: the rows per layer (dense layers: 0)
  double ffn_load_max_over_mean = 0, expert_load_max_over_mean = 0;
  // What a step waits for: per MoE layer, the busiest FFN rank's rows over the mean rank's, averaged over the
  // layers that computed rows, and the worst layer's (1 = even; 0 when no row was computed). A layer ends when
  // its busiest rank does, so this is the load imbalance the step time sees.
  double layer_ffn_max_over_mean = 0, worst_layer_ffn_max_over_mean = 0;
  // The same in time: the expert compute of every MoE layer's busiest FFN rank, summed over the layers (the FFN
  // part of the steps' critical path, measured steps), and what it would be with every rank at the mean, in ms.
  double ffn_critical_ms = 0, ffn_even_ms = 0;
  double ffn_busy_fraction = 0;        // over all FFN ranks: sum busy / sum wall
  double attention_idle_fraction = 0;  // over all attention ranks: sum idle / sum wall
  // Measured steps only (warm-up steps excluded); empty steps are not counted.
  int64_t prefill_tokens = 0, prefill_steps = 0;
  int64_t decode_tokens = 0, decode_steps = 0;
  // Warm-up steps (not measured) with tokens, and their tokens: measured + warm-up = the engine's counts.
  int64_t warmup_steps = 0, warmup_prefill_tokens = 0, warmup_decode_tokens = 0;
  double wall_s = 0;                         // job window: earliest begin to latest end
  double decode_s = 0;                       // the longest attention rank's time in decode steps
  double tokens_per_s_per_rank = 0;          // decode_tokens / decode_s / (A + F)
  double tpot_mean_ms = 0, tpot_p99_ms = 0;  // decode step time
  double prefill_step_mean_ms = 0;
  int num_ranks = 0;
};

AfdReport summarize(std::span<const Metrics> ranks);
// JSON object with every field of the report.
std::string report_json(const AfdReport& r);
// A short human-readable table.
std::string report_text(const AfdReport& r);
// Chrome/Perfetto trace JSON ("traceEvents", complete events in microseconds; pid = world rank).
Status write_chrome_trace(const std::string& path, std::span<const Metrics> ranks);
std::string chrome_trace_json(std::span<const Metrics> ranks);

}  // namespace genbridge::afd
