#pragma once
// A tiny deterministic MoE "model" for AFD tests: the same per-token arithmetic runs monolithically and
// split across attention and FFN ranks, so AFD must reproduce the monolithic tokens and logits bit for
// bit. Every function works on one token at a time (batch-invariant), in fp32 with bf16 rounding at
// the points a real engine rounds (hidden states, expert outputs).
//
// Layer l for a token of request r with residual x (bf16 [H]):
//   a  = attention(l, r, x)   (uses and updates the request's per-layer state: a stand-in KV cache)
//   x1 = bf16(x + a)
//   dense layer: x' = bf16(x1 + bf16(x1 * d_l))
//   MoE layer:   ids, w = router(l, x1) (top-k, softmax over the selected logits)
//                out[j] = expert(l, ids[j], x1)     (bf16 [H])
//                x' = bf16(x1 + bf16(sum_j w[j] * out[j]))   (fixed slot order: the engine's moe_combine)
// logits = lm_head(x_final), next token = argmax (lowest index on ties), next input = embed(token).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include "afd/config.h"
#include "afd/runner.h"
#include "afd/topology.h"
#include "genbridge/core/formats.h"

namespace genbridge::afd::testing {

inline float rnd(uint64_t seed) {
  // splitmix64 -> [-1, 1)
  uint64_t z = seed + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

inline float bf(float v) { return bf16_to_float(float_to_bf16(v)); }

struct ToyModel {
  int H, E, K, L, V;
  std::vector<int> dense;
  std::vector<float> router_w, expert_a, expert_b, attn_p, dense_d, embed, lm;

  explicit ToyModel(const AfdConfig& cfg, int vocab = 97)
      : H(cfg.hidden_size), E(cfg.num_experts), K(cfg.top_k), L(cfg.num_layers), V(vocab), dense(cfg.dense_layers) {
    auto fill = [](std::vector<float>& v, size_t n, uint64_t seed, float scale, float offset = 0.f) {
      v.resize(n);
      for (size_t i = 0; i < n; ++i) v[i] = offset + scale * rnd(seed * 1000003ull + i);
    };
    fill(router_w, size_t(L) * E * H, 1, 0.5f);
    fill(expert_a, size_t(L) * E * H, 2, 0.6f, 0.2f);
    fill(expert_b, size_t(L) * E * H, 3, 0.3f);
    fill(attn_p, size_t(L) * H, 4, 0.5f);
    fill(dense_d, size_t(L) * H, 5, 0.4f);
    fill(embed, size_t(V) * H, 6, 1.0f);
    fill(lm, size_t(V) * H, 7, 0.5f);
  }

  bool is_dense(int l) const { return std::binary_search(dense.begin(), dense.end(), l); }

  // Per-request state: one fp32 [H] accumulator per layer.
  struct Request {
    std::vector<float> kv;  // [L, H]
    int token;
    int remaining;  // tokens still to generate
  };
  Request make_request(int id, int gen_len) const {
    return Request{std::vector<float>(size_t(L) * H, 0.f), (id * 31 + 7) % V, gen_len};
  }

  void embed_token(int token, bf16_t* x) const {
    for (int i = 0; i < H; ++i) x[i] = float_to_bf16(embed[size_t(token) * H + i]);
  }

  // x1 = bf16(x + attention(l, x)); updates the request's state.
  void attention(int l, Request& r, const bf16_t* x, bf16_t* x1) const {
    float* kv = r.kv.data() + size_t(l) * H;
    for (int i = 0; i < H; ++i) {
      const float xi = bf16_to_float(x[i]);
      kv[i] = kv[i] * 0.5f + xi;
      const float a = bf(xi * attn_p[size_t(l) * H + i] + 0.125f * std::tanh(kv[i]));
      x1[i] = float_to_bf16(xi + a);
    }
  }

  void dense_mlp(int l, const bf16_t* x1, bf16_t* out) const {
    for (int i = 0; i < H; ++i) {
      const float v = bf16_to_float(x1[i]);
      out[i] = float_to_bf16(v + bf(v * dense_d[size_t(l) * H + i]));
    }
  }

  void router(int l, const bf16_t* x1, int32_t* ids, float* w) const {
    std::vector<float> logit(E);
    for (int e = 0; e < E; ++e) {
      float s = 0.f;
      const float* row = router_w.data() + (size_t(l) * E + e) * H;
      for (int i = 0; i < H; ++i) s += bf16_to_float(x1[i]) * row[i];
      logit[e] = s;
    }
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    float mx = logit[order[0]], sum = 0.f;
    for (int j = 0; j < K; ++j) {
      ids[j] = order[j];
      w[j] = std::exp(logit[order[j]] - mx);
      sum += w[j];
    }
    for (int j = 0; j < K; ++j) w[j] = w[j] / sum;
  }

  void expert(int l, int e, const bf16_t* x, bf16_t* out) const {
    const float* a = expert_a.data() + (size_t(l) * E + e) * H;
    const float* b = expert_b.data() + (size_t(l) * E + e) * H;
    for (int i = 0; i < H; ++i) {
      const float xi = bf16_to_float(x[i]);
      const float nb = bf16_to_float(x[(i + 1) % H]);
      out[i] = float_to_bf16(xi * a[i] + b[i] + 0.0625f * nb);
    }
  }

  // x' = bf16(x1 + bf16(sum_j w[j] * out[j])), slots in order.
  void combine(const bf16_t* x1, const float* w, const bf16_t* out /* [K, H] */, bf16_t* x) const {
    for (int i = 0; i < H; ++i) {
      float acc = 0.f;
      for (int j = 0; j < K; ++j) acc += w[j] * bf16_to_float(out[size_t(j) * H + i]);
      x[i] = float_to_bf16(bf16_to_float(x1[i]) + bf(acc));
    }
  }

  void lm_head(const bf16_t* x, float* logits) const {
    for (int v = 0; v < V; ++v) {
      float s = 0.f;
      for (int i = 0; i < H; ++i) s += bf16_to_float(x[i]) * lm[size_t(v) * H + i];
      logits[v] = s;
    }
  }
  static int argmax(const float* logits, int n) {
    int best = 0;
    for (int v = 1; v < n; ++v) {
      if (logits[v] > logits[best]) best = v;
    }
    return best;
  }

  // One monolithic decode step of one token.
  void forward(Request& r, std::vector<float>* logits) const {
    std::vector<bf16_t> x(H), x1(H), out(size_t(K) * H);
    std::vector<int32_t> ids(K);
    std::vector<float> w(K);
    embed_token(r.token, x.data());
    for (int l = 0; l < L; ++l) {
      attention(l, r, x.data(), x1.data());
      if (is_dense(l)) {
        dense_mlp(l, x1.data(), x.data());
        continue;
      }
      router(l, x1.data(), ids.data(), w.data());
      for (int j = 0; j < K; ++j) expert(l, ids[j], x1.data(), out.data() + size_t(j) * H);
      combine(x1.data(), w.data(), out.data(), x.data());
    }
    logits->resize(V);
    lm_head(x.data(), logits->data());
  }
};

// Requests of a test job: request i generates gen_len(i) tokens; attention rank a owns i % A == a.
struct Workload {
  int num_requests = 7;
  int max_gen = 4;
  int gen_len(int i) const { return 1 + (i * 5 + 3) % max_gen; }
  int steps() const {
    int s = 0;
    for (int i = 0; i < num_requests; ++i) s = std::max(s, gen_len(i));
    return s;
  }
};

// What a decode produced: per request, the generated tokens and every step's logits (as bits).
struct Trace {
  std::vector<std::vector<int>> tokens;
  std::vector<std::vector<uint32_t>> logit_bits;
  explicit Trace(int n = 0) : tokens(n), logit_bits(n) {}
  void add(int req, int token, const std::vector<float>& logits) {
    tokens[req].push_back(token);
    for (float f : logits) {
      uint32_t b;
      std::memcpy(&b, &f, 4);
      logit_bits[req].push_back(b);
    }
  }
};

inline Trace run_monolithic(const ToyModel& m, const Workload& w, std::span<const int> only = {}) {
  Trace t(w.num_requests);
  std::vector<float> logits;
  for (int i = 0; i < w.num_requests; ++i) {
    if (!only.empty() && std::find(only.begin(), only.end(), i) == only.end()) continue;
    ToyModel::Request r = m.make_request(i, w.gen_len(i));
    while (r.remaining > 0) {
      m.forward(r, &logits);
      r.token = ToyModel::argmax(logits.data(), m.V);
      --r.remaining;
      t.add(i, r.token, logits);
    }
  }
  return t;
}

// The attention side of one rank: its requests, decoded with AFD through an AttentionRunner.
class ToyAttention {
 public:
  ToyAttention(const ToyModel& m, const Workload& w, const AfdConfig& cfg, int rank)
      : m_(m), w_(w), cfg_(cfg), trace_(w.num_requests) {
    for (int i = rank; i < w.num_requests; i += cfg.num_attention) {
      mine_.push_back(i);
      reqs_.push_back(m.make_request(i, w.gen_len(i)));
    }
    const size_t max_tokens = reqs_.size();
    x_.resize(max_tokens * m.H);
    x1_.resize(max_tokens * m.H);
    ids_.resize(max_tokens * m.K);
    wts_.resize(max_tokens * m.K);
  }

  const Trace& trace() const { return trace_; }
  const std::vector<int>& requests() const { return mine_; }

  // Decodes until this rank's requests are done. `lockstep_steps` > 0 keeps stepping (idle, 0 tokens)
  // until that many steps (the sync connector's lockstep); `warmup_steps` idle warm-up steps come first.
  Status run(AttentionRunner& runner, int lockstep_steps, int warmup_steps = 0) {
    int64_t step = 0;
    std::vector<int> stage_tokens(cfg_.num_stages);
    for (int i = 0; i < warmup_steps; ++i) {
      std::fill(stage_tokens.begin(), stage_tokens.end(), 0);
      GB_RETURN_IF_ERROR(runner.step(step++, stage_tokens, /*warmup=*/true, fns()));
    }
    for (int s = 0;; ++s) {
      live_.clear();
      for (size_t i = 0; i < reqs_.size(); ++i) {
        if (reqs_[i].remaining > 0) live_.push_back(static_cast<int>(i));
      }
      if (live_.empty() && s >= lockstep_steps) break;
      const int n = static_cast<int>(live_.size());
      for (int t = 0; t < n; ++t) m_.embed_token(reqs_[live_[t]].token, x_.data() + size_t(t) * m_.H);
      for (int st = 0; st < cfg_.num_stages; ++st) {
        const auto [b, e] = stage_bounds(n, cfg_.num_stages, st);
        stage_tokens[st] = e - b;
      }
      GB_RETURN_IF_ERROR(runner.step(step++, stage_tokens, false, fns()));
      std::vector<float> logits(m_.V);
      for (int t = 0; t < n; ++t) {
        ToyModel::Request& r = reqs_[live_[t]];
        m_.lm_head(x_.data() + size_t(t) * m_.H, logits.data());
        r.token = ToyModel::argmax(logits.data(), m_.V);
        --r.remaining;
        trace_.add(mine_[live_[t]], r.token, logits);
      }
    }
    return runner.finish();
  }

 private:
  AttentionLayerFns fns() {
    AttentionLayerFns f;
    f.attend = [this](int l, int stage, MoeInput* moe) -> Status {
      const int n = static_cast<int>(live_.size());
      const auto [b, e] = stage_bounds(n, cfg_.num_stages, stage);
      const int H = m_.H, K = m_.K;
      for (int t = b; t < e; ++t) {
        m_.attention(l, reqs_[live_[t]], x_.data() + size_t(t) * H, x1_.data() + size_t(t) * H);
        if (!moe) {
          m_.dense_mlp(l, x1_.data() + size_t(t) * H, x_.data() + size_t(t) * H);
        } else {
          m_.router(l, x1_.data() + size_t(t) * H, ids_.data() + size_t(t) * K, wts_.data() + size_t(t) * K);
        }
      }
      if (moe) {
        moe->hidden = TensorView(x1_.data() + size_t(b) * H, DType::kBF16, {e - b, H});
        moe->topk_ids = TensorView(ids_.data() + size_t(b) * K, DType::kI32, {e - b, K});
        moe->topk_weights = TensorView(wts_.data() + size_t(b) * K, DType::kF32, {e - b, K});
      }
      return ok_status();
    };
    f.combine = [this](int, int stage, const MoeInput& moe, TensorView out) -> Status {
      const int n = static_cast<int>(live_.size());
      const auto [b, e] = stage_bounds(n, cfg_.num_stages, stage);
      const int H = m_.H, K = m_.K;
      const float* w = moe.topk_weights.data_as<const float>();
      const bf16_t* o = out.data_as<const bf16_t>();
      for (int t = b; t < e; ++t) {
        m_.combine(x1_.data() + size_t(t) * H, w + size_t(t - b) * K, o + size_t(t - b) * K * H,
                   x_.data() + size_t(t) * H);
      }
      return ok_status();
    };
    return f;
  }

  const ToyModel& m_;
  const Workload& w_;
  AfdConfig cfg_;
  std::vector<int> mine_;
  std::vector<ToyModel::Request> reqs_;
  std::vector<int> live_;
  std::vector<bf16_t> x_, x1_;
  std::vector<int32_t> ids_;
  std::vector<float> wts_;
  Trace trace_;
};

// The FFN side: experts of the toy model.
inline ExpertComputeFn toy_expert_compute(const ToyModel& m) {
  return [&m](const FfnWorkItem& item) -> Status {
    const int H = m.H, K = m.K;
    const bf16_t* x = item.hidden.data_as<const bf16_t>();
    const int32_t* ids = item.topk_ids.data_as<const int32_t>();
    bf16_t* out = item.out.data_as<bf16_t>();
    for (size_t r = 0; r < item.row_token.size(); ++r) {
      const int t = item.row_token[r];
      const int e = ids[size_t(t) * K + item.row_slot[r]];
      if (e < item.expert_begin || e >= item.expert_end) {
        return internal_error("toy expert compute: row for an expert this rank does not own");
      }
      m.expert(item.meta.layer, e, x + size_t(t) * H, out + r * H);
    }
    return ok_status();
  };
}

// A small config for the toy model.
inline AfdConfig toy_config(ConnectorKind connector, int A, int F, int S) {
  AfdConfig c;
  c.num_attention = A;
  c.num_ffn = F;
  c.num_stages = S;
  c.connector = connector;
  c.num_experts = 8;
  c.top_k = 2;
  c.hidden_size = 48;
  c.num_layers = 4;
  c.dense_layers = {0};
  c.max_tokens_per_stage = 8;
  c.timeout_ms = 20000;
  return c;
}

}  // namespace genbridge::afd::testing
