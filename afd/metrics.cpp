#include "afd/metrics.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "afd/byte_codec.h"
#include "runtime/trace/chrome_trace.h"

namespace genbridge::afd {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

int bucket_of(int64_t ns) {
  if (ns < 1) ns = 1;
  const uint64_t v = static_cast<uint64_t>(ns);
  const int e = 63 - std::countl_zero(v);  // floor(log2 v)
  const int sub = e >= 4 ? static_cast<int>((v >> (e - 4)) & 15) : static_cast<int>((v << (4 - e)) & 15);
  const int idx = e * LatencyHistogram::kSubBuckets + sub;
  return std::min(idx, LatencyHistogram::kBuckets - 1);
}

double bucket_mid(int idx) {
  const int e = idx / LatencyHistogram::kSubBuckets;
  const int sub = idx % LatencyHistogram::kSubBuckets;
  return std::ldexp(1.0 + (sub + 0.5) / LatencyHistogram::kSubBuckets, e);
}

}  // namespace

void LatencyHistogram::record(int64_t ns) {
  ++buckets_[bucket_of(ns)];
  if (count_ == 0 || ns < min_ns_) min_ns_ = ns;
  if (count_ == 0 || ns > max_ns_) max_ns_ = ns;
  ++count_;
  sum_ns_ += ns;
}

void LatencyHistogram::merge(const LatencyHistogram& o) {
  if (o.count_ == 0) return;
  for (int i = 0; i < kBuckets; ++i) buckets_[i] += o.buckets_[i];
  min_ns_ = count_ == 0 ? o.min_ns_ : std::min(min_ns_, o.min_ns_);
  max_ns_ = count_ == 0 ? o.max_ns_ : std::max(max_ns_, o.max_ns_);
  count_ += o.count_;
  sum_ns_ += o.sum_ns_;
}

double LatencyHistogram::percentile_ns(double p) const {
  if (count_ == 0) return 0.0;
  if (p <= 0) return static_cast<double>(min_ns_);
  if (p >= 100) return static_cast<double>(max_ns_);
  // Smallest bucket whose cumulative count reaches ceil(p% of count), at least the first sample.
  const double want = std::max(1.0, std::ceil(p / 100.0 * static_cast<double>(count_)));
  int64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[i];
    if (static_cast<double>(seen) >= want) {
      return std::clamp(bucket_mid(i), static_cast<double>(min_ns_), static_cast<double>(max_ns_));
    }
  }
  return static_cast<double>(max_ns_);
}

Metrics::Metrics(const AfdConfig& cfg, int world_rank, Role role, int role_rank, size_t max_trace_events)
    : world_rank_(world_rank),
      role_(role),
      role_rank_(role_rank),
      num_layers_(cfg.num_layers),
      num_stages_(cfg.num_stages),
      transfers_(static_cast<size_t>(2 * cfg.num_layers * cfg.num_stages)),
      trace_capacity_(max_trace_events),
      num_experts_(role == Role::kFfn ? std::max(cfg.num_experts, 0) : 0),
      layer_expert_rows_(static_cast<size_t>(num_experts_) * static_cast<size_t>(std::max(cfg.num_layers, 0)), 0),
      expert_rows_(static_cast<size_t>(num_experts_), 0),
      layer_busy_ns_(role == Role::kFfn ? static_cast<size_t>(std::max(cfg.num_layers, 0)) : 0, 0) {
  events_.reserve(max_trace_events);
}

void Metrics::record_transfer(Direction d, int layer, int stage, int64_t latency_ns, int64_t bytes) {
  if (!recording_ || layer < 0 || layer >= num_layers_ || stage < 0 || stage >= num_stages_) return;
  TransferStats& t = transfers_[index(d, layer, stage)];
  t.latency.record(latency_ns);
  t.bytes += bytes;
  ++t.messages;
}

const TransferStats& Metrics::transfer(Direction d, int layer, int stage) const {
  return transfers_[index(d, layer, stage)];
}

void Metrics::mark_window(int64_t begin_ns, int64_t end_ns) {
  if (!recording_) return;
  if (wall_begin_ns_ == 0 || begin_ns < wall_begin_ns_) wall_begin_ns_ = begin_ns;
  if (end_ns > wall_end_ns_) wall_end_ns_ = end_ns;
}

void Metrics::span(SpanKind kind, int64_t begin_ns, int64_t end_ns, int layer, int stage, int64_t step, int peer) {
  if (!tracing()) return;
  if (events_.size() >= trace_capacity_) {
    ++dropped_events_;
    return;
  }
  events_.push_back(
      TraceEvent{begin_ns, end_ns, step, peer, static_cast<int16_t>(layer), static_cast<int8_t>(stage), kind});
}

// ---- serialization ----

namespace {

constexpr uint32_t kMetricsMagic = 0x4d464147u;  // "GAFM"

void put_hist(ByteWriter& w, const LatencyHistogram& h, int64_t count, int64_t sum, int64_t mn, int64_t mx) {
  w.put(count);
  w.put(sum);
  w.put(mn);
  w.put(mx);
  int32_t nonzero = 0;
  for (int64_t c : h.buckets()) nonzero += c != 0;
  w.put(nonzero);
  for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
    if (h.buckets()[i] != 0) {
      w.put(static_cast<int32_t>(i));
      w.put(h.buckets()[i]);
    }
  }
}

}  // namespace

std::string Metrics::serialize() const {
  ByteWriter w;
  w.put(kMetricsMagic);
  w.put(static_cast<int32_t>(world_rank_));
  w.put(static_cast<int32_t>(role_));
  w.put(static_cast<int32_t>(role_rank_));
  w.put(static_cast<int32_t>(num_layers_));
  w.put(static_cast<int32_t>(num_stages_));
  w.put(busy_ns_);
  w.put(idle_ns_);
  w.put(prefill_tokens_);
  w.put(decode_tokens_);
  w.put(warmup_steps_);
  w.put(warmup_prefill_tokens_);
  w.put(warmup_decode_tokens_);
  w.put(wall_begin_ns_);
  w.put(wall_end_ns_);
  for (const LatencyHistogram* h : {&prefill_step_, &decode_step_})
    put_hist(w, *h, h->count_, h->sum_ns_, h->min_ns_, h->max_ns_);
  for (const TransferStats& t : transfers_) {
    w.put(t.bytes);
    w.put(t.messages);
    put_hist(w, t.latency, t.latency.count_, t.latency.sum_ns_, t.latency.min_ns_, t.latency.max_ns_);
  }
  w.put(static_cast<int32_t>(num_experts_));
  w.put_vec(layer_expert_rows_);
  w.put_vec(layer_busy_ns_);
  w.put(static_cast<int64_t>(events_.size()));
  w.put(dropped_events_);
  if (!events_.empty()) w.put_bytes(events_.data(), events_.size() * sizeof(TraceEvent));
  return w.take();
}

Result<Metrics> Metrics::deserialize(std::string_view bytes) {
  ByteReader r(bytes);
  if (r.get<uint32_t>() != kMetricsMagic) return invalid_argument("afd metrics: not a serialized Metrics blob");
  Metrics m;
  m.world_rank_ = r.get<int32_t>();
  m.role_ = static_cast<Role>(r.get<int32_t>());
  m.role_rank_ = r.get<int32_t>();
  m.num_layers_ = r.get<int32_t>();
  m.num_stages_ = r.get<int32_t>();
  if (!r.ok() || m.num_layers_ < 0 || m.num_stages_ < 0 || m.num_layers_ > (1 << 20) || m.num_stages_ > kMaxStages) {
    return invalid_argument("afd metrics: corrupt blob (layer/stage counts)");
  }
  m.busy_ns_ = r.get<int64_t>();
  m.idle_ns_ = r.get<int64_t>();
  m.prefill_tokens_ = r.get<int64_t>();
  m.decode_tokens_ = r.get<int64_t>();
  m.warmup_steps_ = r.get<int64_t>();
  m.warmup_prefill_tokens_ = r.get<int64_t>();
  m.warmup_decode_tokens_ = r.get<int64_t>();
  m.wall_begin_ns_ = r.get<int64_t>();
  m.wall_end_ns_ = r.get<int64_t>();
  bool corrupt = false;  // a bucket index out of range
  auto get_hist = [&](LatencyHistogram* h) {
    h->count_ = r.get<int64_t>();
    h->sum_ns_ = r.get<int64_t>();
    h->min_ns_ = r.get<int64_t>();
    h->max_ns_ = r.get<int64_t>();
    const int32_t nonzero = r.get<int32_t>();
    for (int32_t i = 0; i < nonzero && r.ok() && !corrupt; ++i) {
      const int32_t idx = r.get<int32_t>();
      const int64_t c = r.get<int64_t>();
      if (idx < 0 || idx >= LatencyHistogram::kBuckets) {
        corrupt = true;
        return;
      }
      h->buckets_[idx] = c;
    }
  };
  get_hist(&m.prefill_step_);
  get_hist(&m.decode_step_);
  m.transfers_.resize(static_cast<size_t>(2 * m.num_layers_ * m.num_stages_));
  for (TransferStats& t : m.transfers_) {
    t.bytes = r.get<int64_t>();
    t.messages = r.get<int64_t>();
    get_hist(&t.latency);
  }
  m.num_experts_ = r.get<int32_t>();
  r.get_vec(&m.layer_expert_rows_);
  r.get_vec(&m.layer_busy_ns_);
  if (m.num_experts_ < 0 ||
      m.layer_expert_rows_.size() != static_cast<size_t>(m.num_experts_) * static_cast<size_t>(m.num_layers_) ||
      (!m.layer_busy_ns_.empty() && m.layer_busy_ns_.size() != static_cast<size_t>(m.num_layers_))) {
    return invalid_argument("afd metrics: corrupt blob (expert rows)");
  }
  m.expert_rows_.assign(static_cast<size_t>(m.num_experts_), 0);
  for (size_t i = 0; i < m.layer_expert_rows_.size(); ++i) {
    m.expert_rows_[i % static_cast<size_t>(m.num_experts_)] += m.layer_expert_rows_[i];
  }
  const int64_t n_events = r.get<int64_t>();
  m.dropped_events_ = r.get<int64_t>();
  if (!r.ok() || corrupt || n_events < 0 || r.remaining() != static_cast<size_t>(n_events) * sizeof(TraceEvent)) {
    return invalid_argument("afd metrics: corrupt blob (truncated)");
  }
  m.events_.resize(static_cast<size_t>(n_events));
  if (n_events > 0) r.get_bytes(m.events_.data(), r.remaining());
  m.trace_capacity_ = m.events_.size();
  return m;
}

// ---- report ----

AfdReport summarize(std::span<const Metrics> ranks) {
  AfdReport rep;
  rep.num_ranks = static_cast<int>(ranks.size());
  if (ranks.empty()) return rep;
  const int L = ranks[0].num_layers(), S = ranks[0].num_stages();
  int64_t begin = 0, end = 0;
  int64_t ffn_busy = 0, ffn_wall = 0, attn_idle = 0, attn_wall = 0;
  LatencyHistogram tpot, prefill;
  int64_t decode_ns = 0;
  int num_attention = 0, num_ffn = 0;
  for (const Metrics& m : ranks) (m.role() == Role::kAttention ? num_attention : num_ffn)++;
  rep.ffn_busy.assign(num_ffn, 0.0);
  rep.ffn_rows.assign(num_ffn, 0);
  rep.attention_idle.assign(num_attention, 0.0);
  for (const Metrics& m : ranks) {
    if (m.wall_ns() > 0) {
      if (begin == 0 || m.wall_begin_ns() < begin) begin = m.wall_begin_ns();
      end = std::max(end, m.wall_end_ns());
    }
    const double frac = m.wall_ns() > 0 ? static_cast<double>(m.role() == Role::kFfn ? m.busy_ns() : m.idle_ns()) /
                                              static_cast<double>(m.wall_ns())
                                        : 0.0;
    if (m.role() == Role::kFfn) {
      ffn_busy += m.busy_ns();
      ffn_wall += m.wall_ns();
      const std::vector<int64_t>& rows = m.expert_rows();
      if (m.role_rank() >= 0 && m.role_rank() < num_ffn) {
        rep.ffn_busy[m.role_rank()] = frac;
        for (int64_t r : rows) rep.ffn_rows[m.role_rank()] += r;
      }
      if (rep.expert_rows.size() < rows.size()) rep.expert_rows.resize(rows.size(), 0);
      for (size_t e = 0; e < rows.size(); ++e) rep.expert_rows[e] += rows[e];
      const size_t E = static_cast<size_t>(m.num_experts());
      if (rep.layer_expert_rows.size() < static_cast<size_t>(m.num_layers())) {
        rep.layer_expert_rows.resize(static_cast<size_t>(m.num_layers()));
      }
      for (size_t l = 0; l < static_cast<size_t>(m.num_layers()); ++l) {
        if (rep.layer_expert_rows[l].size() < E) rep.layer_expert_rows[l].resize(E, 0);
        for (size_t e = 0; e < E; ++e) rep.layer_expert_rows[l][e] += m.layer_expert_rows()[l * E + e];
      }
    } else {
      attn_idle += m.idle_ns();
      attn_wall += m.wall_ns();
      rep.prefill_tokens += m.prefill_tokens();
      rep.decode_tokens += m.decode_tokens();
      rep.warmup_steps += m.warmup_steps();
      rep.warmup_prefill_tokens += m.warmup_prefill_tokens();
      rep.warmup_decode_tokens += m.warmup_decode_tokens();
      tpot.merge(m.decode_step_latency());
      prefill.merge(m.prefill_step_latency());
      decode_ns = std::max(decode_ns, m.decode_step_latency().sum_ns());
      if (m.role_rank() >= 0 && m.role_rank() < num_attention) rep.attention_idle[m.role_rank()] = frac;
    }
  }
  // An FFN rank's vector has an entry for every expert of the model (Metrics' constructor), so the mean is over
  // every expert, the idle ones included.
  const auto max_over_mean = [](const std::vector<int64_t>& v, size_t n) {
    int64_t sum = 0, max = 0;
    for (int64_t x : v) {
      sum += x;
      max = std::max(max, x);
    }
    return sum > 0 && n > 0 ? static_cast<double>(max) * static_cast<double>(n) / static_cast<double>(sum) : 0.0;
  };
  rep.ffn_load_max_over_mean = max_over_mean(rep.ffn_rows, rep.ffn_rows.size());
  rep.expert_load_max_over_mean = max_over_mean(rep.expert_rows, rep.expert_rows.size());
  // Per layer: rows per FFN rank (each rank's own counts, so the split between an expert's copies is seen).
  {
    const int layers = static_cast<int>(rep.layer_expert_rows.size());
    std::vector<std::vector<int64_t>> per_layer(static_cast<size_t>(layers), std::vector<int64_t>(rep.ffn_rows.size(), 0));
    for (const Metrics& m : ranks) {
      if (m.role() != Role::kFfn || m.role_rank() < 0 || m.role_rank() >= num_ffn) continue;
      const size_t E = static_cast<size_t>(m.num_experts());
      for (size_t l = 0; l < static_cast<size_t>(std::min(layers, m.num_layers())); ++l) {
        for (size_t e = 0; e < E; ++e) per_layer[l][static_cast<size_t>(m.role_rank())] += m.layer_expert_rows()[l * E + e];
      }
    }
    double sum = 0;
    int counted = 0;
    for (const std::vector<int64_t>& rows : per_layer) {
      const double r = max_over_mean(rows, rows.size());
      if (r == 0) continue;
      sum += r;
      ++counted;
      rep.worst_layer_ffn_max_over_mean = std::max(rep.worst_layer_ffn_max_over_mean, r);
    }
    rep.layer_ffn_max_over_mean = counted > 0 ? sum / counted : 0.0;
    // The same in time.
    for (int l = 0; l < layers; ++l) {
      int64_t max = 0, total = 0;
      int n = 0;
      for (const Metrics& m : ranks) {
        if (m.role() != Role::kFfn || l >= static_cast<int>(m.layer_busy_ns().size())) continue;
        max = std::max(max, m.layer_busy_ns()[static_cast<size_t>(l)]);
        total += m.layer_busy_ns()[static_cast<size_t>(l)];
        ++n;
      }
      rep.ffn_critical_ms += static_cast<double>(max) * 1e-6;
      if (n > 0) rep.ffn_even_ms += static_cast<double>(total) / n * 1e-6;
    }
  }
  rep.ffn_busy_fraction = ffn_wall > 0 ? static_cast<double>(ffn_busy) / static_cast<double>(ffn_wall) : 0.0;
  rep.attention_idle_fraction = attn_wall > 0 ? static_cast<double>(attn_idle) / static_cast<double>(attn_wall) : 0.0;
  rep.wall_s = static_cast<double>(end - begin) * 1e-9;
  rep.decode_s = static_cast<double>(decode_ns) * 1e-9;
  rep.tokens_per_s_per_rank =
      rep.decode_s > 0 ? static_cast<double>(rep.decode_tokens) / rep.decode_s / static_cast<double>(rep.num_ranks)
                       : 0.0;
  rep.prefill_steps = prefill.count();
  rep.decode_steps = tpot.count();
  rep.tpot_mean_ms = tpot.mean_ns() * 1e-6;
  rep.tpot_p99_ms = tpot.percentile_ns(99) * 1e-6;
  rep.prefill_step_mean_ms = prefill.mean_ns() * 1e-6;
  for (int d = 0; d < 2; ++d) {
    for (int l = 0; l < L; ++l) {
      for (int s = 0; s < S; ++s) {
        TransferStats all;
        for (const Metrics& m : ranks) {
          if (m.num_layers() != L || m.num_stages() != S) continue;
          const TransferStats& t = m.transfer(static_cast<Direction>(d), l, s);
          all.latency.merge(t.latency);
          all.bytes += t.bytes;
          all.messages += t.messages;
        }
        if (all.messages == 0) continue;
        rep.links.push_back(AfdReport::Link{l, s, static_cast<Direction>(d), all.latency.percentile_ns(50) * 1e-3,
                                            all.latency.percentile_ns(99) * 1e-3, all.bytes, all.messages});
      }
    }
  }
  return rep;
}

std::string report_json(const AfdReport& r) {
  std::string links;
  for (size_t i = 0; i < r.links.size(); ++i) {
    const AfdReport::Link& k = r.links[i];
    links += fmt::format(
        "{}{{\"direction\":\"{}\",\"layer\":{},\"stage\":{},\"p50_us\":{:.3f},\"p99_us\":{:.3f},\"bytes\":{},"
        "\"messages\":{}}}",
        i ? "," : "", k.direction == Direction::kAttnToFfn ? "attention_to_ffn" : "ffn_to_attention", k.layer, k.stage,
        k.p50_us, k.p99_us, k.bytes, k.messages);
  }
  auto list = [](const std::vector<double>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}{:.4f}", i ? "," : "", v[i]);
    return s;
  };
  return fmt::format(
      "{{\"ranks\":{},\"prefill_tokens\":{},\"prefill_steps\":{},\"decode_tokens\":{},\"decode_steps\":{},"
      "\"warmup_steps\":{},\"warmup_prefill_tokens\":{},\"warmup_decode_tokens\":{},"
      "\"wall_s\":{:.6f},\"decode_s\":{:.6f},\"decode_tokens_per_s_per_rank\":{:.3f},\"prefill_step_mean_ms\":{:.4f},"
      "\"tpot_mean_ms\":{:.4f},\"tpot_p99_ms\":{:.4f},\"ffn_busy_fraction\":{:.4f},\"attention_idle_fraction\":{:.4f},"
      "\"ffn_busy\":[{}],\"attention_idle\":[{}],\"ffn_rows\":[{}],\"ffn_load_max_over_mean\":{:.4f},"
      "\"expert_rows\":[{}],\"expert_load_max_over_mean\":{:.4f},\"layer_ffn_max_over_mean\":{:.4f},"
      "\"worst_layer_ffn_max_over_mean\":{:.4f},\"ffn_critical_ms\":{:.3f},\"ffn_even_ms\":{:.3f},\"links\":[{}]}}",
      r.num_ranks, r.prefill_tokens, r.prefill_steps, r.decode_tokens, r.decode_steps, r.warmup_steps,
      r.warmup_prefill_tokens, r.warmup_decode_tokens, r.wall_s, r.decode_s, r.tokens_per_s_per_rank,
      r.prefill_step_mean_ms, r.tpot_mean_ms, r.tpot_p99_ms, r.ffn_busy_fraction, r.attention_idle_fraction,
      list(r.ffn_busy), list(r.attention_idle), fmt::join(r.ffn_rows, ","), r.ffn_load_max_over_mean,
      fmt::join(r.expert_rows, ","), r.expert_load_max_over_mean, r.layer_ffn_max_over_mean,
      r.worst_layer_ffn_max_over_mean, r.ffn_critical_ms, r.ffn_even_ms, links);
}

std::string report_text(const AfdReport& r) {
  std::string s = fmt::format(
      "AFD: {} ranks; {} prefill + {} decode tokens, of which {} + {} in {} warm-up steps (not measured)\n"
      "measured: {} prefill tokens in {} steps (mean {:.3f} ms), {} decode tokens in {} steps\n"
      "decode {:.1f} tokens/s per rank (all ranks counted; {:.3f} s in decode steps); TPOT (decode step) mean {:.3f} "
      "ms, p99 {:.3f} ms\nFFN busy fraction {:.3f}, attention idle fraction {:.3f}\n",
      r.num_ranks, r.prefill_tokens + r.warmup_prefill_tokens, r.decode_tokens + r.warmup_decode_tokens,
      r.warmup_prefill_tokens, r.warmup_decode_tokens, r.warmup_steps, r.prefill_tokens, r.prefill_steps,
      r.prefill_step_mean_ms, r.decode_tokens, r.decode_steps, r.tokens_per_s_per_rank, r.decode_s, r.tpot_mean_ms,
      r.tpot_p99_ms, r.ffn_busy_fraction, r.attention_idle_fraction);
  if (r.ffn_load_max_over_mean > 0) {
    const auto hottest = std::max_element(r.expert_rows.begin(), r.expert_rows.end());
    s += fmt::format(
        "expert load: rows per FFN rank [{}] (max / mean {:.3f}); the busiest expert, {}, {} rows (max / mean over "
        "{} experts {:.3f}); per MoE layer, busiest FFN rank / mean {:.3f} on average, {:.3f} at worst\n"
        "expert compute on the critical path (each MoE layer's busiest FFN rank, summed): {:.1f} ms, {:.1f} ms if "
        "every rank took the mean\n",
        fmt::join(r.ffn_rows, ", "), r.ffn_load_max_over_mean, hottest - r.expert_rows.begin(), *hottest,
        r.expert_rows.size(), r.expert_load_max_over_mean, r.layer_ffn_max_over_mean, r.worst_layer_ffn_max_over_mean,
        r.ffn_critical_ms, r.ffn_even_ms);
  }
  s += "direction        layer stage   p50_us   p99_us        bytes  messages\n";
  for (const AfdReport::Link& k : r.links) {
    s += fmt::format("{:<16} {:>5} {:>5} {:>8.2f} {:>8.2f} {:>12} {:>9}\n",
                     k.direction == Direction::kAttnToFfn ? "attention->ffn" : "ffn->attention", k.layer, k.stage,
                     k.p50_us, k.p99_us, k.bytes, k.messages);
  }
  return s;
}

std::string chrome_trace_json(std::span<const Metrics> ranks) {
  static constexpr const char* kKindName[] = {"attention", "ffn", "transfer", "wait"};
  int64_t t0 = 0;
  for (const Metrics& m : ranks) {
    for (const TraceEvent& e : m.events()) {
      if (t0 == 0 || e.begin_ns < t0) t0 = e.begin_ns;
    }
  }
  runtime::ChromeTraceWriter w(t0);
  for (const Metrics& m : ranks) {
    w.process(m.world_rank(),
              fmt::format("{} rank {} (world rank {})", role_name(m.role()), m.role_rank(), m.world_rank()));
    for (int k = 0; k < 4; ++k) w.thread(m.world_rank(), k, kKindName[k]);
    for (const TraceEvent& e : m.events()) {
      const char* kind = kKindName[static_cast<int>(e.kind)];
      w.span(fmt::format("{} L{} S{}", kind, e.layer, e.stage), kind, m.world_rank(), static_cast<int>(e.kind),
             e.begin_ns, e.end_ns,
             fmt::format("{{\"layer\":{},\"stage\":{},\"step\":{},\"peer\":{}}}", e.layer, e.stage, e.step, e.peer));
    }
  }
  return w.finish();
}

Status write_chrome_trace(const std::string& path, std::span<const Metrics> ranks) {
  return runtime::write_trace_file(path, chrome_trace_json(ranks));
}

}  // namespace genbridge::afd
