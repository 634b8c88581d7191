#pragma once
// Latency samples and summary statistics for the engine's metrics table (and AFD's per-rank report).

#include <cstdint>
#include <vector>

namespace genbridge::engine {

// Nearest-rank percentile (p in [0, 100]) of `samples`; 0 for an empty set. Does not modify `samples`.
double percentile(const std::vector<double>& samples, double p);
double mean(const std::vector<double>& samples);

struct EngineMetrics {
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;   // tokens produced by decode steps (not the first token of each request)
  double prefill_seconds = 0;  // wall time inside prefill forwards
  double decode_seconds = 0;   // wall time inside decode forwards
  std::vector<double> ttft_seconds;  // per request: submission -> first token
  std::vector<double> tpot_seconds;  // per generated token after the first: time since the previous token
  int64_t kv_bytes_per_token = 0;    // all layers, K and V, as the DeviceOperator's contract sizes them
  int64_t requests_finished = 0;
  int64_t requests_refused = 0;
  int64_t requests_failed = 0;  // ended with FinishReason::kError (e.g. non-finite logits)
  int64_t requests_cancelled = 0;  // ended by Engine::cancel
  int64_t preemptions = 0;         // running requests preempted (Preemption::kRecompute)
  int64_t recomputed_tokens = 0;   // tokens the preempted requests had in the KV cache, fed again on resumption
  // Prefix caching: tokens of the requests started (each start counts its tokens; a resumed one counts again), of
  // them the tokens found in the cache, and cached pages evicted.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t prefix_cache_evictions = 0;
  int64_t prefix_cache_pages = 0;  // pages cached after the last forward (held by requests or not)
};

}  // namespace genbridge::engine
